// A user-defined Scorer that returns NaN for write_score == -0.125 (RetentionDecay elsewhere): what
// only a user-defined Scorer can return (the built-in ones never do), for the tests of the host's
// NaN guard (tests/cuda/nan_scorer.hpp is the device tests').
#pragma once

#include <cmath>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/parts/score/retention.hpp"

namespace testing {

struct NaNScorer {
  static constexpr bool needs_key_norm = false;
  void validate() const {}
  float operator()(kvpolicy::EntryMeta m, kvpolicy::StepContext c) const {
    return m.write_score == -0.125f ? std::nanf("") : kvpolicy::score::RetentionDecay{}(m, c);
  }
};

}  // namespace testing
