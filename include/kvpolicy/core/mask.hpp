/// \file
/// kvpolicy/core/mask.hpp — which cached keys a query may see (SPEC §6: causal), and WG-KV's
/// vertical-slash mask (SPEC §3): with local = W_local > 0, query i sees key j iff j <= i and
/// (i - j < W_local or g_j >= tau), g_j being the key's write-gate value (gate_of). The
/// same rule is the ring's lazy promotion seen from a decode token: the token its ring slot
/// displaces is already promoted or gone.
#pragma once

#include <cstdint>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/math.hpp"

namespace kvpolicy {

/// Which of an entry's write-time floats holds its write gate g for the mask: the write score in
/// WG-KV's own cache (g is the frozen score evict::WriteGated ranks by), the gate beside an
/// Admitter's ring (admit::WriteGate, which reads EntryMeta::gate).
enum class GateField : std::uint8_t { write_score, gate };

/// Which keys a query may see: causal, and with local > 0 WG-KV's vertical-slash mask (SPEC §3), the local
/// newest keys and the older ones whose g >= tau. The device attention reads g from the pool's
/// write_score only (GateField::write_score).
struct AttentionMask {
  std::int64_t local = 0;  ///< W_local; 0 = causal only
  float tau = 0.0f;        ///< admission threshold
  /// where a key's g is, named by the Evictor or Admitter that gives the mask
  GateField gate_field = GateField::write_score;
  /// sinks S (SPEC §5): keys at positions 0..S-1 stay visible whatever their g (the Evictor keeps them)
  std::int64_t sinks = 0;

  KVPOLICY_HD float gate_of(const EntryMeta& m) const {
    return gate_field == GateField::gate ? m.gate : m.write_score;
  }
  KVPOLICY_HD bool visible(std::int32_t key_pos, float key_gate, std::int32_t query_pos) const {
    return key_pos <= query_pos &&
           (local == 0 || std::int64_t{query_pos} - key_pos < local || key_gate >= tau || key_pos < sinks);
  }
};

}  // namespace kvpolicy
