// registry::open_cache compiled once for the project's programs, for the storage type
// KVPOLICY_OPEN_CACHE_STORAGE names: every policy's Cache over that storage (open.hpp says why).
// apps/CMakeLists.txt compiles this file once per storage type the programs open (the
// kvpolicy_open_cache target); the programs define KVPOLICY_EXTERN_OPEN_CACHE and link it.
#include "kvpolicy/open.hpp"

namespace kvpolicy::registry {
KVPOLICY_OPEN_CACHE_INSTANCE(KVPOLICY_OPEN_CACHE_STORAGE);
}  // namespace kvpolicy::registry
