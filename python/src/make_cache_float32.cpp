// make_cache for K and V stored as float32 (make_cache.hpp: one storage type per translation unit).
#include "make_cache.hpp"

namespace kvpolicy::python::detail {
std::unique_ptr<AnyCache> make_float32(const registry::Selection& s, const CacheShape& shape, std::int64_t pages) {
  return registry::open_cache<float>(s, shape, pages);
}
}  // namespace kvpolicy::python::detail
