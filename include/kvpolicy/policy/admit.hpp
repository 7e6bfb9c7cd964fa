/// \file
/// kvpolicy/policy/admit.hpp — Admitters. TRIM-KV and DBTrimKV admit every token (they act only at
/// eviction time); write-time admission (WG-KV, SPEC §3) composes here.
#pragma once

#include "kvpolicy/core/concepts.hpp"

namespace kvpolicy::admit {

struct All {
  KVPOLICY_HD Admission admit(EntryMeta) const { return Admission::keep; }
};

static_assert(Admitter<All>, "admit::All must model kvpolicy::Admitter");

}  // namespace kvpolicy::admit
