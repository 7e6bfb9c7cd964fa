/// \file
/// kvpolicy/parts/evict/union.hpp — token-level (union) eviction, SPEC §8: one decision per
/// (sequence, position). A token leaves every (layer, kv head) at once, as an engine whose cache
/// cell holds a token's K/V for all kv heads of a layer (llama.cpp, vLLM's blocks, TensorRT-LLM's
/// `union` mode) must evict. The per-head scores of a position are aggregated into one (max or
/// mean over the heads that hold it), and the sequence keeps its top M positions in every head.
/// Memory: L * Hkv * M entries, the same as a per-head budget of M.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/parts/evict/memory_bound.hpp"
#include "kvpolicy/parts/evict/rank.hpp"

namespace kvpolicy::evict {

/// How a position's per-head scores become its one score (SPEC §8).
enum class Aggregate : std::uint8_t {
  max,   ///< the best head's score: the token stays while any head would keep it
  mean,  ///< the heads' mean (ranks as their sum): attention mass and key statistics add up over heads
};

/// One position's aggregate from the scores of the heads holding it (SPEC §8): max, or the mean
/// summed in double and rounded to fp32; an infinite score decides alone (+inf if any head
/// protects the position, else -inf if any head refuses it), so no inf - inf arises.
struct PositionScore {
  Aggregate aggregate = Aggregate::max;
  double sum = 0.0;
  float best = -std::numeric_limits<float>::infinity();
  std::int64_t count = 0;
  bool plus_inf = false, minus_inf = false;

  void add(float s) {
    ++count;
    best = std::max(best, s);
    if (s == std::numeric_limits<float>::infinity())
      plus_inf = true;
    else if (s == -std::numeric_limits<float>::infinity())
      minus_inf = true;
    else
      sum += static_cast<double>(s);
  }
  float value() const {
    if (aggregate == Aggregate::max) return best;
    if (plus_inf) return std::numeric_limits<float>::infinity();
    if (minus_inf) return -std::numeric_limits<float>::infinity();
    return static_cast<float>(sum / static_cast<double>(count));
  }
};

/// SPEC §8: the sequence triggers once it holds M + B positions (every head holds the same
/// positions, so its L * Hkv heads hold L * Hkv * (M + B) entries) and keeps, in every head, its
/// top M positions by (aggregate score, larger position); the S oldest and the w newest positions
/// rank above every score. Composes with admit::All only (every head must store every token).
/// The Cache constructor throws for M < 1, B < 1, w outside [0, M] or S outside [0, M - w], each
/// named with its value. Under tensor parallelism (dist::with_sharded_evictor) it is refused.
struct Union {
  static constexpr bool needs_every_token = true;
  std::int64_t budget = default_budget;  // M tokens per sequence (L * Hkv * M entries)
  std::int64_t buffer = default_buffer;  // B
  std::int64_t window = 0;     // w newest positions protected
  std::int64_t sinks = 0;      // S oldest positions protected
  Aggregate aggregate = Aggregate::max;

  void validate(const CacheShape& shape) const {
    shape.validate();
    require(budget >= 1, "evict::Union: budget M = ", budget, " must be >= 1");
    require(buffer >= 1, "evict::Union: buffer B = ", buffer, " must be >= 1");
    require(budget <= INT32_MAX - buffer, "evict::Union: budget M = ", budget, " plus buffer B = ", buffer,
            " exceeds 2^31 - 1 positions");
    require(window >= 0 && window <= budget, "evict::Union: window w = ", window, " must be in [0, budget M = ", budget, "]");
    require(sinks >= 0 && sinks <= budget - window, "evict::Union: sinks S = ", sinks,
            " must be in [0, budget M - window w = ", budget - window, "]");
  }
  // the trigger, stated as the pooled rules' (core/rule.hpp); the selection aggregates over heads,
  // which no HeadSelection or PoolSelection states: a select() of its own (run on the host)
  std::int64_t group_heads(const CacheShape& shape) const { return shape.heads_total(); }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t heads, StepContext) const {
    return length >= heads * (budget + buffer);
  }
  /// Every head holds the sequence's positions: at most M + B - 1 after a commit.
  std::optional<MemoryBound> memory_bound(const CacheShape& shape) const {
    const std::int64_t held = budget + buffer - 1;
    return MemoryBound{held, shape.heads_total() * held};
  }

  /// keep[i] = 1 for every entry whose position survives (SPEC §8).
  void select(const CacheShape&, StepContext, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    const auto kept = surviving_positions(s);
    for (std::size_t i = 0; i < s.position.size(); ++i)
      keep[i] = std::binary_search(kept.begin(), kept.end(), s.position[i]) ? 1 : 0;
  }

  /// The surviving positions of the segments, sorted: one selection over every head's scores, what
  /// select() keeps in each head.
  std::vector<std::int32_t> surviving_positions(const SegmentedScores& s) const {
    // the distinct positions, sorted, each with its aggregate over the heads that hold it
    std::vector<std::int32_t> position(s.position.begin(), s.position.end());
    std::sort(position.begin(), position.end());
    position.erase(std::unique(position.begin(), position.end()), position.end());
    std::vector<PositionScore> agg(position.size(), PositionScore{aggregate});
    for (std::size_t i = 0; i < s.position.size(); ++i) {
      const auto at = std::lower_bound(position.begin(), position.end(), s.position[i]) - position.begin();
      agg[static_cast<std::size_t>(at)].add(s.score[i]);
    }
    std::vector<float> score(position.size());
    for (std::size_t j = 0; j < position.size(); ++j) score[j] = agg[j].value();
    rank::protect_sinks(position, sinks, score);
    rank::protect_window(position, window, score);
    std::vector<std::uint8_t> keep(position.size());
    rank::keep_top_k(score, position, budget, keep);
    std::vector<std::int32_t> kept;
    for (std::size_t j = 0; j < position.size(); ++j)
      if (keep[j]) kept.push_back(position[j]);
    return kept;
  }
};

static_assert(Evictor<Union>, "evict::Union must model kvpolicy::Evictor");

}  // namespace kvpolicy::evict
