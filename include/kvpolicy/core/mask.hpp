/// \file
/// kvpolicy/core/mask.hpp — which cached keys a query may see (SPEC §6: causal), and WG-KV's
/// vertical-slash mask (SPEC §3): with local = W_local > 0, query i sees key j iff j <= i and
/// (i - j < W_local or g_j >= tau), g_j being the key's write-gate value (its metadata float). The
/// same rule is the ring's lazy promotion seen from a decode token: the token its ring slot
/// displaces is already promoted or gone.
#pragma once

#include <cstdint>

#include "kvpolicy/core/math.hpp"

namespace kvpolicy {

struct AttentionMask {
  std::int64_t local = 0;  ///< W_local; 0 = causal only
  float tau = 0.0f;        ///< admission threshold
  /// where a key's g is: EntryMeta::gate (an Admitter's ring, admit::WriteGate) when true, else the
  /// metadata float (WG-KV's own cache, where g is the frozen score)
  bool reads_gate = false;
  /// sinks S (SPEC §5): keys at positions 0..S-1 stay visible whatever their g (the Evictor keeps them)
  std::int64_t sinks = 0;

  KVPOLICY_HD bool visible(std::int32_t key_pos, float key_gate, std::int32_t query_pos) const {
    return key_pos <= query_pos &&
           (local == 0 || std::int64_t{query_pos} - key_pos < local || key_gate >= tau || key_pos < sinks);
  }
};

}  // namespace kvpolicy
