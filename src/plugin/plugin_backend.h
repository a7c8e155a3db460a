// A plugin's backends and transports as the registries know them (internal).
#pragma once

#include <memory>

#include "plugin/plugin_abi.h"
#include "tutti/backend.h"
#include "tutti/tensor_transport.h"

namespace tutti::detail {

BackendInfo plugin_backend_info(std::shared_ptr<PluginLibrary> lib,
                                const tuttiBackend_v1_t* backend);
TransportInfo plugin_transport_info(std::shared_ptr<PluginLibrary> lib,
                                    const tuttiTransport_v1_t* transport);

}  // namespace tutti::detail
