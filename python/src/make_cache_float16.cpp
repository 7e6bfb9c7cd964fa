// make_cache for K and V stored as float16 (any_cache.hpp: one storage type per translation unit).
#include "any_cache.hpp"

namespace kvpolicy::python::detail {
std::unique_ptr<AnyCache> make_float16(const registry::Selection& s, const CacheShape& shape, std::int64_t pages) {
  return make_cache_for<half>(s, shape, pages);
}
}  // namespace kvpolicy::python::detail
