// A composition that cannot work must fail to compile with a one-line reason: WG-KV's admission
// ring and WG-KV's own evictor both mask the attention. KVPOLICY_CONTROL=1 compiles the same file
// with TRIM-KV's evictor instead, which composes.
#include "kvpolicy/trimkv.hpp"
#include "kvpolicy/wgkv.hpp"

#if KVPOLICY_CONTROL
using Evictor = kvpolicy::evict::PerHead<kvpolicy::trigger::Buffered>;
#else
using Evictor = kvpolicy::evict::WriteGated;
#endif

int main() {
  kvpolicy::Cache<kvpolicy::score::RetentionDecay, kvpolicy::admit::WriteGate, Evictor, kvpolicy::memory::Paged<16>,
                  kvpolicy::cpu_backend>
      cache(kvpolicy::CacheShape{1, 1, 1, 4}, kvpolicy::memory::Paged<16>(4));
  return cache.has_sequence(0) ? 1 : 0;
}
