/// \file
/// kvpolicy/core/entry.hpp — what a cache entry carries besides K/V, and what a step knows.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>

#include "kvpolicy/core/math.hpp"

namespace kvpolicy {

/// What one cache entry carries besides its K/V: its position p in its sequence, the write score
/// append was handed with it (its `log_beta` argument), which the Scorer interprets — log beta for
/// the retention scorers (SPEC §1 "Each entry stores its position p and log_beta"), the static score
/// for a Scorer that declares static_score (EpiKV and the KV statistics, SPEC §4: handed to append,
/// or set before commit by set_step_scores), g in WG-KV's own cache (SPEC §3, score::Frozen under
/// evict::WriteGated) — and the per-entry fields a part declares it reads (Field, below), each 0
/// (the gate: 1) where no part of the composition declares it.
struct EntryMeta {
  std::int32_t position = 0;
  float write_score = 0.0f;
  float key_norm = 0.0f;
  float attention_mass = 0.0f;
  float gate = 1.0f;
};

/// The per-entry fields beyond position and write score. A part that reads one declares it
/// (`static constexpr FieldSet entry_fields{...}`, as a FlashInfer variant declares what it reads);
/// the pools and kernels of every backend carry the declared ones, each by its Field alone:
///   key_norm        written with the entry: ||k||_2 of its key as handed in (KNorm, SPEC §1, §5);
///   gate            written with the entry: the write gate g handed in beside it, 1 when none
///                   (WG-KV's admission, SPEC §3; the vertical-slash mask beside it);
///   attention_mass  0 when written, then the Scorer's record_mass hook adds the probability each
///                   query gives the key (H2O, SPEC §5): the one field that changes.
enum class Field : std::uint8_t { key_norm, gate, attention_mass };
inline constexpr int field_count = 3;
inline constexpr Field fields_all[field_count] = {Field::key_norm, Field::gate, Field::attention_mass};

/// Where a field's value comes from.
enum class FieldSource : std::uint8_t { key, handed, attention };
KVPOLICY_HD constexpr FieldSource source_of(Field f) {
  return f == Field::key_norm ? FieldSource::key : f == Field::gate ? FieldSource::handed : FieldSource::attention;
}
/// How a part that declares a field uses it, for messages ("this Scorer reads key_norm").
constexpr const char* field_use(Field f) {
  return f == Field::key_norm ? "reads key_norm" : f == Field::gate ? "reads gate" : "ranks by attention_mass (H2O)";
}
/// A field's value before anything is written into it.
KVPOLICY_HD constexpr float initial_value(Field f) { return f == Field::gate ? 1.0f : 0.0f; }

/// A set of Fields.
struct FieldSet {
  std::uint8_t bits = 0;
  constexpr FieldSet() = default;
  constexpr FieldSet(std::initializer_list<Field> fields) {
    for (const Field f : fields) bits = static_cast<std::uint8_t>(bits | (1u << static_cast<unsigned>(f)));
  }
  KVPOLICY_HD constexpr bool has(Field f) const { return ((bits >> static_cast<unsigned>(f)) & 1u) != 0; }
  constexpr FieldSet operator|(FieldSet o) const {
    FieldSet s;
    s.bits = static_cast<std::uint8_t>(bits | o.bits);
    return s;
  }
  constexpr bool empty() const { return bits == 0; }
};

/// The member of EntryMeta that holds a field.
KVPOLICY_HD float& field_of(EntryMeta& m, Field f) {
  return f == Field::key_norm ? m.key_norm : f == Field::gate ? m.gate : m.attention_mass;
}
KVPOLICY_HD float field_of(const EntryMeta& m, Field f) {
  return f == Field::key_norm ? m.key_norm : f == Field::gate ? m.gate : m.attention_mass;
}

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
/// budget_binds: false when the Evictor has told, before the scoring, that its budget keeps every
/// entry the scores could choose between this step (WG-KV's hard budget within L·Hkv·M_avg:
/// evictor_tells_binding); a Scorer may then skip what only a binding budget reads (appendix K's
/// attention), since no survivor depends on it. True otherwise.
/// probe: the tokens of a probe step (SPEC §10; Cache::open_probe), 0 for any other step. A probe's
/// entries are at positions n - probe .. n - 1 and leave at its commit; n - probe is the sequence's
/// length before and after it.
struct StepContext {
  std::int64_t n = 0;
  std::int64_t prompt = 0;
  bool prompt_ends = false;
  std::int64_t entries = 0;
  std::int64_t head = 0;
  bool budget_binds = true;
  std::int64_t probe = 0;
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

/// The first two moments of the queries a sequence attended with at one layer, before RoPE (Expected
/// Attention, docs/policies.md), for one kv head's query group: over `count` queries, sum [G, d] and the sum
/// of outer products [G, d, d] (row-major, symmetric), in double; `next_position` is the position
/// after the newest query summed.
struct QueryMoments {
  const double* sum = nullptr;
  const double* outer = nullptr;
  std::int64_t group = 0, head_dim = 0, count = 0, next_position = 0;
  const double* sum_of(std::int64_t g) const { return sum + g * head_dim; }
  const double* outer_of(std::int64_t g) const { return outer + g * head_dim * head_dim; }
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
