/// \file
/// kvpolicy/parts/admit/write_gate.hpp — WG-KV's write-time admission (SPEC §3), the Admitter that
/// composes with any Evictor (the one that admits every token: parts/admit/all.hpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/mask.hpp"

namespace kvpolicy::admit {

/// WG-KV's write-time admission (SPEC §3) as an Admitter that composes with any Evictor: a token
/// whose write gate g (EntryMeta::gate, handed to append beside log_beta) is >= tau is admitted to
/// the cache (keep); any other lives in its head's local ring only (local): the Cache drops it once
/// W_local newer entries of the head exist, before the Evictor ranks what is left, and the attention
/// applies the vertical-slash mask so a query never sees it past its ring. Admitted entries are then
/// the Evictor's to keep or evict (e.g. TRIM-KV retention: wgkv.hpp's WGKVRetentionCache).
struct WriteGate {
  static constexpr FieldSet entry_fields{Field::gate};
  std::int64_t local = 256;  ///< W_local
  double tau = 0.1;          ///< admitted iff g >= tau

  void validate() const {
    require(local >= 1 && local <= INT32_MAX, "admit::WriteGate: W_local = ", local, " must be in [1, 2^31 - 1]");
    require(std::isfinite(tau) && tau > 0.0 && tau <= 1.0, "admit::WriteGate: tau = ", tau, " must be in (0, 1]");
  }
  std::int64_t ring() const { return local; }
  AttentionMask attention_mask() const { return {local, static_cast<float>(tau), GateField::gate}; }
  KVPOLICY_HD Admission admit(EntryMeta m) const {
    return m.gate >= static_cast<float>(tau) ? Admission::keep : Admission::local;
  }
};

static_assert(Admitter<WriteGate>, "admit::WriteGate must model kvpolicy::Admitter");

}  // namespace kvpolicy::admit
