/// \file
/// kvpolicy/parts/score/retention.hpp — Scorers: retention scores of SPEC §1–2 as pure KVPOLICY_HD math.
/// The CPU path and every kernel call these operator()s; the math is written once.
#pragma once

#include <cmath>
#include <limits>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/math.hpp"

namespace kvpolicy::score {

/// Distance term e = n + 1 - p (SPEC §1: `n + 1` is the reference code's q_idx). Formed in float
/// from an exact int64 difference, so large positions lose nothing before the product.
KVPOLICY_HD float exponent(EntryMeta m, StepContext c) { return static_cast<float>(c.n + 1 - m.position); }

/// log of beta^e: e * log_beta (one rounding on every backend, core/math.hpp), with log_beta == 0 (beta == 1) scoring exactly 0 for every e
/// (0 * e) and log_beta == -inf scoring -inf.
KVPOLICY_HD float retention(float log_beta, float e) { return math::mul_rn(log_beta, e); }

/// TRIM-KV, SPEC §1: score(p) = log_beta * (n + 1 - p). The retention scorers below read log_beta
/// from EntryMeta::write_score (what append was handed as log_beta).
struct RetentionDecay {
  void validate() const {}
  KVPOLICY_HD float operator()(EntryMeta m, StepContext c) const { return retention(m.write_score, exponent(m, c)); }
};

/// DBTrimKV lookahead, SPEC §2 Eq. 9: log G = e*log_beta + log(expm1(h*log_beta)/expm1(log_beta)).
/// horizon = 1 is exactly RetentionDecay.
struct Lookahead {
  int horizon = 2;
  void validate() const { require(horizon >= 1, "Lookahead: horizon h = ", horizon, " must be >= 1"); }
  KVPOLICY_HD float operator()(EntryMeta m, StepContext c) const {
    return math::add_rn(retention(m.write_score, exponent(m, c)), math::lookahead_log_ratio(m.write_score, horizon));
  }
};

/// KNorm-weighted retention, SPEC §1 variant `knorm`: log_beta*(n+1-p) + log(max(||k||_2, 1e-12)).
struct KNormRetention {
  static constexpr FieldSet entry_fields{Field::key_norm};
  void validate() const {}
  KVPOLICY_HD float operator()(EntryMeta m, StepContext c) const {
    return math::add_rn(retention(m.write_score, exponent(m, c)), math::log_via_double(fmaxf(m.key_norm, 1e-12f)));
  }
};

/// A score handed in at write time and frozen (SPEC §4: "computed once when the token is produced,
/// then frozen"): EpiKV, HS-var and the KV statistics. EntryMeta::write_score holds it; higher = keep.
struct Frozen {
  static constexpr bool static_score = true;
  void validate() const {}
  KVPOLICY_HD float operator()(EntryMeta m, StepContext) const { return m.write_score; }
};

static_assert(Scorer<RetentionDecay>, "RetentionDecay must model kvpolicy::Scorer");
static_assert(Scorer<Lookahead>, "Lookahead must model kvpolicy::Scorer");
static_assert(Scorer<KNormRetention>, "KNormRetention must model kvpolicy::Scorer");
static_assert(Scorer<Frozen>, "Frozen must model kvpolicy::Scorer");

}  // namespace kvpolicy::score
