/// \file
/// kvpolicy/policy/baseline.hpp — the static scores of SPEC §5's training-free baselines that need
/// nothing but an entry's own metadata: StreamingLLM (recency with attention sinks), KNorm (low key
/// norm first) and Random (seeded). Higher = keep, as every Scorer; they compose with any Evictor
/// (the presets in baselines.hpp use the per-head buffered budget of SPEC §1).
#pragma once

#include <cstdint>
#include <limits>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/math.hpp"

namespace kvpolicy::score {

/// StreamingLLM, SPEC §5: score = p (the newest first); the first `sinks` positions (S = 4) score
/// +inf and are never evicted. Positions above 2^24 round in fp32; the tie-break (larger position
/// wins, SPEC Ties) keeps the order exact.
struct Recency {
  static constexpr bool needs_key_norm = false;
  std::int64_t sinks = 4;
  void validate() const { require(sinks >= 0, "score::Recency: sinks S = ", sinks, " must be >= 0"); }
  KVPOLICY_HD float operator()(EntryMeta m, StepContext) const {
    return m.position < sinks ? std::numeric_limits<float>::infinity() : static_cast<float>(m.position);
  }
};

/// KNorm, SPEC §5: score = -||k||_2 (keys of small norm draw attention and are kept).
struct NegKeyNorm {
  static constexpr bool needs_key_norm = true;
  void validate() const {}
  KVPOLICY_HD float operator()(EntryMeta m, StepContext) const { return -m.key_norm; }
};

/// Random, SPEC §5: a uniform score in [0, 1) drawn once per position from `seed` (SplitMix64 of
/// seed and position, top 24 bits): the same on every backend, every run, and every head.
struct SeededRandom {
  static constexpr bool needs_key_norm = false;
  std::uint64_t seed = 0;
  void validate() const {}
  KVPOLICY_HD float operator()(EntryMeta m, StepContext) const {
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<std::uint64_t>(static_cast<std::uint32_t>(m.position)) + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  }
};

static_assert(Scorer<Recency>, "Recency must model kvpolicy::Scorer");
static_assert(Scorer<NegKeyNorm>, "NegKeyNorm must model kvpolicy::Scorer");
static_assert(Scorer<SeededRandom>, "SeededRandom must model kvpolicy::Scorer");

}  // namespace kvpolicy::score
