// make_cache for K and V stored as bfloat16 (make_cache.hpp: one storage type per translation unit).
#include "make_cache.hpp"

namespace kvpolicy::python::detail {
std::unique_ptr<AnyCache> make_bfloat16(const registry::Selection& s, const CacheShape& shape, std::int64_t pages) {
  return registry::open_cache<bfloat16>(s, shape, pages);
}
}  // namespace kvpolicy::python::detail
