// The Python module's Cache: the policy's Cache by name (registry::open_cache) behind AnyCache, one
// K/V storage type per translation unit (make_cache_*.cpp, compiled in parallel), chosen at run
// time by make_cache.
#pragma once

#include <cstdint>
#include <memory>

#include "kvpolicy/open.hpp"

namespace kvpolicy::python {

/// The Cache the registry opens for `selection`, with a pool of `pages` pages of 16 entries.
std::unique_ptr<AnyCache> make_cache(const registry::Selection& selection, const CacheShape& shape, std::int64_t pages,
                                     KvStorage storage);

namespace detail {
std::unique_ptr<AnyCache> make_float32(const registry::Selection&, const CacheShape&, std::int64_t);
std::unique_ptr<AnyCache> make_float16(const registry::Selection&, const CacheShape&, std::int64_t);
std::unique_ptr<AnyCache> make_bfloat16(const registry::Selection&, const CacheShape&, std::int64_t);
}  // namespace detail

}  // namespace kvpolicy::python
