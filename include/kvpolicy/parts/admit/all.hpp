/// \file
/// kvpolicy/parts/admit/all.hpp — the Admitter that admits every token: every policy but WG-KV acts
/// only at eviction time (SPEC §3 is the write-time alternative, parts/admit/write_gate.hpp).
#pragma once

#include "kvpolicy/core/concepts.hpp"

namespace kvpolicy::admit {

/// The Admitter every policy but WG-KV composes: it stores every token.
struct All {
  static constexpr bool stores_every_token = true;
  KVPOLICY_HD Admission admit(EntryMeta) const { return Admission::keep; }
};

static_assert(Admitter<All>, "admit::All must model kvpolicy::Admitter");

}  // namespace kvpolicy::admit
