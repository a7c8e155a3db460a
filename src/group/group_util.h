// Small helpers shared by the core's group code (internal).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/hash.h"  // Fnv1a, WordMix

namespace tutti::detail {

// How an op's description ends, after its dtype and shape: " x 2 devices", " root 1" (and
// " tensor 0" with several devices or another tensor), " sum", " layout 12345"; each part only
// where it applies. For OpSignature::str and the op check's fingerprints.
std::string signature_tail(int devices, int root, int root_tensor, int reduce_op, uint64_t layout);

// Percent-encodes every byte outside [A-Za-z0-9._-], so any group name is safe inside a store
// key, a file name or a shared-memory segment name ("a/b" -> "a%2Fb").
std::string escape_name(std::string_view name);

}  // namespace tutti::detail
