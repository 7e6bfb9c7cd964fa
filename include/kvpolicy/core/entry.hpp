/// \file
/// kvpolicy/core/entry.hpp — what a cache entry carries besides K/V, and what a step knows.
#pragma once

#include <cstdint>
#include <span>

namespace kvpolicy {

/// What one cache entry carries besides its K/V. Every field but attention_mass is written once,
/// when the token is appended:
/// - position: the token's position p in its sequence.
/// - write_score: the scalar append was handed with the token (its `log_beta` argument), which the
///   Scorer interprets: log beta for the retention scorers (SPEC §1 "Each entry stores its position
///   p and log_beta"); the static score for a Scorer that declares static_score (EpiKV and the KV
///   statistics, SPEC §4: handed to append, or set before commit by
///   set_step_scores); g in WG-KV's own cache, where the score is the
///   write gate (SPEC §3, score::Frozen under evict::WriteGated).
/// - key_norm: ||k||_2 of the stored (post-RoPE) key, for a Scorer that declares needs_key_norm
///   (KNorm, SPEC §1 and §5), else 0.
/// - attention_mass: the one field that changes, the attention mass the key has received from every
///   query so far, accumulated by the attention for a Scorer that declares needs_attention_mass
///   (H2O, SPEC §5), else 0.
/// - gate: WG-KV's write gate g in [0, 1] (SPEC §3) when append is handed one beside the write
///   score (an Admitter that decides by it, admit::WriteGate); 1 when it is not.
/// Which float holds g for the vertical-slash mask the mask itself names (AttentionMask::gate_field).
struct EntryMeta {
  std::int32_t position = 0;
  float write_score = 0.0f;
  float key_norm = 0.0f;
  float attention_mass = 0.0f;
  float gate = 1.0f;
};

/// The step context a score is evaluated in: n = tokens of the sequence processed so far, after the
/// current forward step appended to every layer (SPEC, Notation).
/// prompt = how many leading positions of the sequence are its prompt (prefill) tokens, as far as
/// known: the prompt length the engine declared, or while it is still being prefilled every token
/// so far (SPEC §4 protects every prefill token).
/// prompt_ends: this step reaches the prompt length the engine declared (SnapKV compresses then).
/// entries: the sequence's entries over every layer and head after the step, before its eviction
/// (WG-KV's hard budget, SPEC §3 appendix K) — after an Admitter's ring has dropped its departures.
/// head: the (layer, kv head) whose entries are being scored, as head_index(shape, layer, head); every
/// backend sets it per head before it scores (Random draws per (layer, head, position), SPEC §5).
struct StepContext {
  std::int64_t n = 0;
  std::int64_t prompt = 0;
  bool prompt_ends = false;
  std::int64_t entries = 0;
  std::int64_t head = 0;
};

/// The last queries a sequence attended with at one layer (oldest first), for scorers that rank
/// by observed attention (SnapKV, SPEC §5): queries [G, W, d] of one kv head's query group, and
/// the positions [W] of the W tokens.
struct ObservedQueries {
  const float* data = nullptr;
  std::int64_t group = 0, window = 0, head_dim = 0;
  std::span<const std::int32_t> position;
  const float* query(std::int64_t g, std::int64_t w) const { return data + (g * window + w) * head_dim; }
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
