// The umbrella header: everything a user of tutti needs except DLPack interop
// (tutti/dlpack.h), which is separate so that DLPack's header is only needed where it is used.
#pragma once

#include "tutti/backend.h"
#include "tutti/collective.h"
#include "tutti/collective_group.h"
#include "tutti/embedding.h"
#include "tutti/env.h"
#include "tutti/error.h"
#include "tutti/file_store.h"
#include "tutti/hash_store.h"
#include "tutti/op_type.h"
#include "tutti/options.h"
#include "tutti/prefix_store.h"
#include "tutti/redis_store.h"
#include "tutti/store.h"
#include "tutti/tcp_store.h"
#include "tutti/tensor_ref.h"
#include "tutti/tensor_view.h"
#include "tutti/transfer_agent.h"
#include "tutti/types.h"
#include "tutti/version.h"
#include "tutti/work.h"
