// A Scorer that returns NaN at one position (RetentionDecay elsewhere): what only a user-defined
// Scorer can return, for the tests of the device's NaN guard.
#pragma once

#include <cstdint>

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/parts/score/retention.hpp"

namespace cudatest {

struct NaNAt {
  static constexpr bool needs_key_norm = false;
  std::int32_t position = 0;
  void validate() const {}
  KVPOLICY_HD float operator()(kvpolicy::EntryMeta m, kvpolicy::StepContext c) const {
    return m.position == position ? kvpolicy::dtype::bits_float(0x7fc00000u) : kvpolicy::score::RetentionDecay{}(m, c);
  }
};

}  // namespace cudatest
