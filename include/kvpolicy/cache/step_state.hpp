/// \file
/// kvpolicy/cache/step_state.hpp — the Cache's step state machine (cache.hpp), whatever its
/// Backend: a sequence's open step (SPEC, "When eviction runs"), the prompt it detects (SPEC §4),
/// and every input check of a step, run on all layers before anything is written (SPEC §7). The
/// backends differ in where entries live and how a step changes memory, never in what a step
/// accepts or refuses.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/memory/pool.hpp"

namespace kvpolicy {

/// One sequence's whole forward step, every layer at once: keys/values [L, Hkv, T, d], log_beta
/// [L, Hkv, T]; queries/out [L, Hq, T, d], or empty views to skip attention.
struct SequenceStep {
  std::int64_t seq = 0;
  View<const float, 4> keys, values;
  View<const float, 3> log_beta;
  View<const float, 4> queries{};
  View<float, 4> out{};
  View<const float, 3> gate{};  ///< [L, Hkv, T] write gates, for an Admitter that reads them
};

/// One entry an eviction removed, for tools that trace decisions (kvpolicy-replay).
struct EvictedEntry {
  int layer = 0;
  int head = 0;
  std::int32_t position = 0;
};

/// What a commit did: whether the Evictor's trigger fired, and how many entries left the cache
/// (by the Evictor, or by an Admitter's ring, SPEC §3).
struct EvictionReport {
  bool triggered = false;
  std::int64_t evicted = 0;
};

/// What one head of a sequence holds, read back in storage order (Cache::head_contents): each
/// entry's metadata and its key and value rows, widened to fp32 ([length, d] each).
struct HeadContents {
  std::vector<EntryMeta> meta;
  std::vector<float> keys, values;
};

namespace detail {

/// Layer l of a [L, ...] view (null stays null): how step() hands each layer to append().
template <class T, int R>
View<T, R - 1> layer_of(View<T, R> v, int l) {
  std::array<std::int64_t, R - 1> s{};
  for (int i = 1; i < R; ++i) s[static_cast<std::size_t>(i - 1)] = v.shape[static_cast<std::size_t>(i)];
  View<T, R - 1> out{nullptr, s};
  out.data = v.data == nullptr ? nullptr : v.data + std::int64_t{l} * out.size();
  return out;
}

/// The context an open step's eviction is planned in (SPEC, Notation; SPEC §4 for the prompt):
/// n after the step; the prompt declared (prompt >= 0) or, undeclared, every token before the
/// first single-token step that follows another.
inline StepContext step_context(std::int64_t n_before, std::int64_t pending, std::int64_t prompt) {
  const std::int64_t n = n_before + pending;
  if (prompt >= 0) return {n, std::min(prompt, n), n_before < prompt && n >= prompt};
  if (pending == 1 && n_before > 0) return {n, n_before, false};
  return {n, n, false};
}

/// The write score of each appended token (EntryMeta::write_score): a frozen score (finite or -inf,
/// SPEC §4) for a static-score Scorer, else log_beta in [-inf, 0] (SPEC, Notation). NaN never enters.
template <class S>
void check_log_beta(int layer, std::int64_t first_position, View<const float, 2> log_beta,
                    const char* who = "Cache::append") {
  for (std::int64_t h = 0; h < log_beta.dim(0); ++h)
    for (std::int64_t t = 0; t < log_beta.dim(1); ++t) {
      const float lb = log_beta(h, t);
      if constexpr (scorer_static_score<S>)  // +inf is what protection ranks as
        require(!std::isnan(lb) && lb != std::numeric_limits<float>::infinity(), who, ": score[layer ", layer,
                ", head ", h, ", token ", t, " of the step (position ", first_position + t, ")] = ", lb,
                " must be finite or -inf");
      else  // beta in (0, 1] so log_beta <= 0; -inf (beta -> 0) ranks last
        require(!std::isnan(lb) && lb <= 0.0f, who, ": log_beta[layer ", layer, ", head ", h, ", token ", t,
                " of the step (position ", first_position + t, ")] = ", lb, " is not in [-inf, 0]");
    }
}

/// K/V must stay finite in the storage dtype (70000 is finite in fp32, +inf in fp16).
template <class Storage>
void check_storage_finite(int layer, View<const float, 3> keys, View<const float, 3> values) {
  for (std::int64_t i = 0; i < keys.size(); ++i)
    require(std::isfinite(to_float(from_float<Storage>(keys.data[i]))) &&
                std::isfinite(to_float(from_float<Storage>(values.data[i]))),
            "Cache::append: layer ", layer, " keys/values hold a value that is not finite in ", dtype_name<Storage>(),
            " at flat index ", i, " (key ", keys.data[i], ", value ", values.data[i], ")");
}

/// Where one sequence stands in its step cycle: n committed tokens, the open step's T and which
/// layers it appended and attended, the prompt length (declared, or detected at the first decode
/// step). A backend's per-sequence state derives from it.
struct StepState {
  std::int64_t n = 0;        // tokens processed by committed steps
  std::int64_t pending = 0;  // T of the open step, 0 when none
  std::int64_t prompt = -1;  // declared or detected prompt length; -1 while unknown
  bool probe = false;        // the next or open step is a probe (SPEC §10): its tokens never join n
  std::vector<std::uint8_t> appended, attended;

  StepState() = default;
  StepState(int layers, std::int64_t prompt_tokens)
      : prompt(prompt_tokens), appended(static_cast<std::size_t>(layers), 0),
        attended(static_cast<std::size_t>(layers), 0) {}

  /// The prompt length the policies see (declared, or detected at the first decode step; while
  /// the sequence is still in its prefill, every committed token).
  std::int64_t prompt_tokens() const { return prompt >= 0 ? std::min(prompt, n) : n; }
  /// The context the open step's eviction is planned in (SPEC §4 for the prompt; SPEC §10 for a
  /// probe, which neither ends nor detects the prompt).
  StepContext context() const {
    if (!probe) return step_context(n, pending, prompt);
    StepContext c{n + pending, prompt_tokens(), false};
    c.probe = pending;
    return c;
  }
  /// Commits the open step planned in `planned` (its context()): the first decode step fixes an
  /// undeclared prompt (SPEC §4 protects it from then on), n += T, and the step ends. A probe's
  /// tokens leave with their entries: n stays.
  void commit(const StepContext& planned) {
    if (!probe) {
      if (prompt < 0 && planned.prompt < planned.n) prompt = planned.prompt;
      n += pending;
    }
    end();
  }
  /// No step open: every layer may append again, and the next step is an ordinary one.
  void end() {
    pending = 0;
    probe = false;
    std::fill(appended.begin(), appended.end(), std::uint8_t{0});
    std::fill(attended.begin(), attended.end(), std::uint8_t{0});
  }
};

/// A whole step, layer by layer, as the layer API takes it: write(l, keys, values, log_beta, gate)
/// for every layer l, each followed by attend(l, queries, out) when the step has queries.
template <class Write, class Attend>
void for_each_layer(const SequenceStep& s, int layers, Write&& write, Attend&& attend) {
  for (int l = 0; l < layers; ++l) {
    write(l, layer_of(s.keys, l), layer_of(s.values, l), layer_of(s.log_beta, l), layer_of(s.gate, l));
    if (s.queries.data != nullptr) attend(l, layer_of(s.queries, l), layer_of(s.out, l));
  }
}

/// The sequences of a Cache, each with its state (a StepState and what the backend keeps beside
/// it), with add_sequence's checks and the error for an unknown id.
template <class State>
class Sequences {
 public:
  /// A new sequence's state, checked first (prompt_tokens in range, the id unused); registers
  /// nothing: the caller inserts it once nothing else can fail.
  State make(std::int64_t seq, int layers, std::int64_t prompt_tokens) const {
    require(prompt_tokens >= -1 && prompt_tokens <= std::int64_t{std::numeric_limits<std::int32_t>::max()},
            "Cache::add_sequence: prompt_tokens = ", prompt_tokens, " must be -1 (unknown) or in [0, 2^31 - 1]");
    require(!contains(seq), "Cache::add_sequence: sequence ", seq, " already exists");
    State st;
    static_cast<StepState&>(st) = StepState(layers, prompt_tokens);
    return st;
  }
  void insert(std::int64_t seq, State st) { states_.emplace(seq, std::move(st)); }
  void erase(std::int64_t seq) { states_.erase(seq); }
  bool contains(std::int64_t seq) const { return states_.count(seq) != 0; }
  const State& at(std::int64_t seq) const {
    const auto it = states_.find(seq);
    if (it == states_.end()) fail("Cache: unknown sequence ", seq);
    return it->second;
  }
  State& at(std::int64_t seq) { return const_cast<State&>(std::as_const(*this).at(seq)); }

 private:
  std::map<std::int64_t, State> states_;
};

/// Every input check of a step, for a Cache of this shape, Scorer S, Admitter A and storage type:
/// what append(), attend() and step() accept, with the messages both backends give. Each check
/// only reads; a Cache runs all of a call's checks before its first write.
template <class S, class A, class Storage>
struct StepChecks {
  CacheShape shape;

  void layer(int l, const char* what) const {
    require(l >= 0 && l < shape.layers, "Cache::", what, ": layer ", l, " out of range [0, ", shape.layers, ")");
  }
  void head(int h, const char* what) const {
    require(h >= 0 && h < shape.kv_heads, "Cache::", what, ": head ", h, " out of range [0, ", shape.kv_heads, ")");
  }
  /// commit(seq): a step is open, and every layer appended it (and attended it, for a Scorer that
  /// ranks by the attention it observes).
  void commit(std::int64_t seq, const StepState& st, bool observes_attention) const {
    require(st.pending > 0, "Cache::commit: sequence ", seq, " has no open step");
    for (int l = 0; l < shape.layers; ++l) {
      require(st.appended[static_cast<std::size_t>(l)], "Cache::commit: layer ", l, " of sequence ", seq,
              " was not appended in this step");
      require(!observes_attention || st.attended[static_cast<std::size_t>(l)], "Cache::commit: layer ", l,
              " of sequence ", seq, " was not attended (observed, over engine-owned K/V) in this step; this policy ranks by attention");
    }
  }
  void step_tokens(std::int64_t seq, const StepState& st, std::int64_t T) const {
    require(T >= 1, "Cache: a step appends T = ", T, " tokens; T must be >= 1");
    require(st.pending == 0 || st.pending == T, "Cache::append: sequence ", seq, " step has T = ", st.pending,
            " tokens, this layer has T = ", T);
    // positions are int32 on every backend
    require(st.n + T <= std::int64_t{std::numeric_limits<std::int32_t>::max()}, "Cache: sequence ", seq, " at n = ",
            st.n, " cannot take ", T, " more tokens: positions must stay below 2^31 - 1");
  }
  /// append(seq, layer, …): the layer is in range, the step's T agrees, the layer is not appended yet.
  void append(std::int64_t seq, const StepState& st, int l, std::int64_t T) const {
    layer(l, "append");
    step_tokens(seq, st, T);
    require(!st.appended[static_cast<std::size_t>(l)], "Cache::append: layer ", l, " of sequence ", seq,
            " was already appended in this step; call commit() first");
  }
  void layer_inputs(int l, std::int64_t T, std::int64_t first_position, View<const float, 3> keys,
                    View<const float, 3> values, View<const float, 2> log_beta, View<const float, 2> gate) const {
    require_shape(keys, {shape.kv_heads, T, shape.head_dim}, "Cache::append: keys");
    // over engine-owned K/V nothing reads the values: they may be left empty
    if (stores_kv_v<Storage> || values.data != nullptr)
      require_shape(values, {shape.kv_heads, T, shape.head_dim}, "Cache::append: values");
    require_shape(log_beta, {shape.kv_heads, T}, "Cache::append: log_beta");
    if constexpr (admitter_reads_gate<A>)
      require(gate.data != nullptr, "Cache: layer ", l,
              ": this Admitter decides by the write gate g; append needs gate [Hkv, T] (step: SequenceStep::gate "
              "[L, Hkv, T])");
    if (gate.data != nullptr) {  // SPEC §3: g = sigmoid(...) is in [0, 1]
      require_shape(gate, {shape.kv_heads, T}, "Cache::append: gate");
      for (std::int64_t h = 0; h < shape.kv_heads; ++h)
        for (std::int64_t t = 0; t < T; ++t)
          require(gate(h, t) >= 0.0f && gate(h, t) <= 1.0f, "Cache::append: gate[layer ", l, ", head ", h,
                  ", token ", t, " of the step (position ", first_position + t, ")] = ", gate(h, t),
                  " is not in [0, 1]");
    }
    check_log_beta<S>(l, first_position, log_beta);
    if constexpr (stores_kv_v<Storage>) check_storage_finite<Storage>(l, keys, values);
    if constexpr (reads_field<S>(Field::key_norm))  // SPEC §1 knorm: log ||k|| must be finite for the score to be
      for (std::int64_t h = 0; h < shape.kv_heads; ++h)
        for (std::int64_t t = 0; t < T; ++t)
          require(std::isfinite(memory::key_norm(&keys(h, t, 0), shape.head_dim)), "Cache::append: layer ", l,
                  " head ", h, " token ", t, ": the key's norm overflows fp32");
  }
  void queries(View<const float, 3> q, int l, const char* call = "Cache::attend") const {
    for (std::int64_t i = 0; i < q.size(); ++i)
      require(std::isfinite(q.data[i]), call, ": layer ", l, " queries hold ", q.data[i], " at flat index ", i);
  }
  /// step(): every layer's inputs, before any is written. `needs_queries`: the policy ranks by
  /// attention (H2O's mass, SnapKV's window), so a step must attend.
  void step(const SequenceStep& s, const StepState& st, bool needs_queries) const {
    require(st.pending == 0, "Cache::step: sequence ", s.seq, " has a step open by append(); commit() it first");
    const std::int64_t T = s.keys.dim(2);
    step_tokens(s.seq, st, T);
    require_shape(s.keys, {shape.layers, shape.kv_heads, T, shape.head_dim}, "Cache::step: keys");
    if (stores_kv_v<Storage> || s.values.data != nullptr)
      require_shape(s.values, {shape.layers, shape.kv_heads, T, shape.head_dim}, "Cache::step: values");
    require_shape(s.log_beta, {shape.layers, shape.kv_heads, T}, "Cache::step: log_beta");
    if (s.gate.data != nullptr) require_shape(s.gate, {shape.layers, shape.kv_heads, T}, "Cache::step: gate");
    if constexpr (!stores_kv_v<Storage>) {
      // SPEC §9: the engine attends over its own K/V; a policy that ranks by attention observes its queries
      require(s.out.data == nullptr && (s.queries.data == nullptr || needs_queries), "Cache::step: sequence ", s.seq,
              ": this cache keeps no K/V (storage engine_owned), so the engine attends itself: pass no out",
              needs_queries ? "" : ", and no queries (this policy does not rank by attention)");
      if (needs_queries)
        require(s.queries.data != nullptr, "Cache::step: sequence ", s.seq,
                ": this policy ranks by attention; a step over engine-owned K/V needs the engine's queries");
    } else if (needs_queries) {
      require(s.queries.data != nullptr, "Cache::step: sequence ", s.seq,
              ": this policy ranks by attention; a step needs queries and out");
    }
    if (s.queries.data != nullptr || s.out.data != nullptr) {
      require_shape(s.queries, {shape.layers, shape.q_heads, T, shape.head_dim}, "Cache::step: queries");
      if constexpr (stores_kv_v<Storage>)
        require_shape(View<const float, 4>(s.out), {shape.layers, shape.q_heads, T, shape.head_dim}, "Cache::step: out");
    }
    for (int l = 0; l < shape.layers; ++l) {
      layer_inputs(l, T, st.n, layer_of(s.keys, l), layer_of(s.values, l), layer_of(s.log_beta, l),
                   layer_of(s.gate, l));
      if (s.queries.data != nullptr) queries(layer_of(s.queries, l), l, "Cache::step");
    }
  }
};

}  // namespace detail
}  // namespace kvpolicy
