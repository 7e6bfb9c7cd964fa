/// \file
/// kvpolicy/parts/score/baseline.hpp — the scores of SPEC §5's training-free baselines: StreamingLLM
/// (recency with attention sinks), KNorm (low key norm first) and Random (seeded) from an entry's
/// own metadata; H2O from the attention mass its record adds up; KeyDiff from the head's
/// keys. Higher = keep, as every Scorer; they compose with any Evictor (the presets in
/// baselines.hpp use the per-head buffered budget of SPEC §1).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/math.hpp"
#include "kvpolicy/core/view.hpp"

namespace kvpolicy::score {

/// StreamingLLM, SPEC §5: score = p (the newest first); the first `sinks` positions (S = 4) score
/// +inf and are never evicted. Positions above 2^24 round in fp32; the tie-break (larger position
/// wins, SPEC Ties) keeps the order exact.
struct Recency {
  std::int64_t sinks = 4;
  void validate() const { require(sinks >= 0, "score::Recency: sinks S = ", sinks, " must be >= 0"); }
  KVPOLICY_HD float operator()(EntryMeta m, StepContext) const {
    return m.position < sinks ? math::kInfinity : static_cast<float>(m.position);
  }
};

/// KNorm, SPEC §5: score = -||k||_2 (keys of small norm draw attention and are kept).
struct NegKeyNorm {
  static constexpr FieldSet entry_fields{Field::key_norm};
  void validate() const {}
  KVPOLICY_HD float operator()(EntryMeta m, StepContext) const { return -m.key_norm; }
};

/// Random, SPEC §5: a uniform score in [0, 1) drawn independently per (layer, kv head, position)
/// from `seed`: SplitMix64 of seed and (head_index << 32 | position), top 24 bits. The same on
/// every backend and every run; different heads keep different survivors.
struct SeededRandom {
  std::uint64_t seed = 0;
  void validate() const {}
  KVPOLICY_HD float operator()(EntryMeta m, StepContext c) const {
    const std::uint64_t key = (static_cast<std::uint64_t>(c.head) << 32) | static_cast<std::uint32_t>(m.position);
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (key + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  }
};

/// H2O, SPEC §5: the attention mass the key has received, summed over every query so far (and over
/// the query heads of its GQA group). Its record's hook adds each step's probabilities into the
/// entry's metadata as the attention hands them over, and keeps what it added until the step closes,
/// so that a step taken back puts every entry's mass back; no attention matrix is formed.
struct AttentionMass {
  static constexpr FieldSet entry_fields{Field::attention_mass};
  /// (slot, mass before) of each addition of the open step
  using Record = std::vector<std::pair<std::int64_t, float>>;
  void validate() const {}
  Record open_record(const CacheShape&, std::int64_t) const { return {}; }
  void record_mass(Record& r, EntryFields fields, std::span<const std::int64_t> slots, std::span<const float> mass) const {
    for (std::size_t j = 0; j < slots.size(); ++j) {
      float& m = fields(slots[j], Field::attention_mass);
      r.emplace_back(slots[j], m);
      m += mass[j];
    }
  }
  void commit_record(Record& r) const { r.clear(); }
  void discard_record(Record& r, EntryFields fields) const {  // newest first: each slot ends at its value before the step
    for (auto it = r.rbegin(); it != r.rend(); ++it) fields(it->first, Field::attention_mass) = it->second;
    r.clear();
  }
  KVPOLICY_HD float operator()(EntryMeta m, StepContext) const { return m.attention_mass; }
};

/// KeyDiff, SPEC §5: score_i = -cos(k_i, a) with a = the mean of the head's normalised keys
/// (k_j / ||k_j||, over every entry of the head at eviction time): keys least like the head's
/// average direction are kept. A zero key, or a zero anchor, has cosine 0; the anchor counts as
/// zero when its norm is within rounding of it (keys that cancel exactly: ||sum|| <= 1e-12 N),
/// where its direction would be noise. In double, then fp32.
struct KeyDiff {
  static constexpr double kZeroAnchor = 1e-12;
  void validate() const {}
  void score_head(View<const float, 2> keys, std::span<const EntryMeta>, StepContext, std::span<float> out) const {
    const std::int64_t N = keys.dim(0), d = keys.dim(1);
    std::vector<double> anchor(static_cast<std::size_t>(d), 0.0), norm(static_cast<std::size_t>(N), 0.0);
    for (std::int64_t i = 0; i < N; ++i) {
      double s = 0.0;
      for (std::int64_t c = 0; c < d; ++c) s += static_cast<double>(keys(i, c)) * keys(i, c);
      norm[static_cast<std::size_t>(i)] = std::sqrt(s);
      if (s > 0.0)
        for (std::int64_t c = 0; c < d; ++c) anchor[static_cast<std::size_t>(c)] += keys(i, c) / norm[static_cast<std::size_t>(i)];
    }
    // anchor holds the sum of the normalised keys: the mean's direction, which is all a cosine sees
    double anchor_norm = 0.0;
    for (std::int64_t c = 0; c < d; ++c) anchor_norm += anchor[static_cast<std::size_t>(c)] * anchor[static_cast<std::size_t>(c)];
    anchor_norm = std::sqrt(anchor_norm);
    for (std::int64_t i = 0; i < N; ++i) {
      const double kn = norm[static_cast<std::size_t>(i)];
      double dot = 0.0;
      for (std::int64_t c = 0; c < d; ++c) dot += keys(i, c) * anchor[static_cast<std::size_t>(c)];
      const double cosine = kn > 0.0 && anchor_norm > kZeroAnchor * static_cast<double>(N) ? dot / (kn * anchor_norm) : 0.0;
      out[static_cast<std::size_t>(i)] = static_cast<float>(-cosine);
    }
  }
};

static_assert(Scorer<Recency>, "Recency must model kvpolicy::Scorer");
static_assert(Scorer<NegKeyNorm>, "NegKeyNorm must model kvpolicy::Scorer");
static_assert(Scorer<SeededRandom>, "SeededRandom must model kvpolicy::Scorer");
static_assert(Scorer<AttentionMass>, "AttentionMass must model kvpolicy::Scorer");
static_assert(Scorer<KeyDiff>, "KeyDiff must model kvpolicy::Scorer");

}  // namespace kvpolicy::score
