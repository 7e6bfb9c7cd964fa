/// \file
/// kvpolicy/core/entry.hpp — what a cache entry carries besides K/V, and what a step knows.
#pragma once

#include <cstdint>
#include <span>

namespace kvpolicy {

/// Written once when the token is appended, never changed (SPEC §1 "Each entry stores its
/// position p and log_beta"). key_norm = ||k||_2 of the stored (post-RoPE) key, for KNorm scores.
struct EntryMeta {
  std::int32_t position = 0;
  float log_beta = 0.0f;
  float key_norm = 0.0f;
};

/// The step context a score is evaluated in: n = tokens of the sequence processed so far, after the
/// current forward step appended to every layer (SPEC, Notation).
struct StepContext {
  std::int64_t n = 0;
};

/// Scores of the entries of one sequence, as ragged segments, one per (layer, kv head) in
/// head_index order: segment s is [offsets[s], offsets[s+1]). This is the layout the selection
/// kernels of every backend take.
struct SegmentedScores {
  std::span<const float> score;
  std::span<const std::int32_t> position;
  std::span<const std::int64_t> offsets;  // heads_total + 1 entries
  std::int64_t segments() const { return static_cast<std::int64_t>(offsets.size()) - 1; }
  std::int64_t length(std::int64_t s) const { return offsets[s + 1] - offsets[s]; }
};

/// What an Admitter decides for a new entry at write time (WG-KV: keep in the global cache, keep in
/// the local ring only, or drop).
enum class Admission : std::uint8_t { keep, local, drop };

}  // namespace kvpolicy
