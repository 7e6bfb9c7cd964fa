/// \file
/// kvpolicy/inputs/producer.hpp — what a policy reads from the forward pass, produced in one place.
/// A registry entry names its input kind (`registry::Inputs`); `inputs::producer<P>(values, model)`
/// builds the one producer of that kind, and an engine (kvpolicy-lm, kvpolicy-replay, Python's
/// transformers cache) hands it the tensors its `needs()` lists and appends what it writes:
///   retention_gate, tied_retention_gate  log beta from the layer's normed input (SPEC §1, §2)
///   surrogate                            KVzap's predicted log KVzip+ score from the normed input (SPEC §11)
///   write_gate                           g from the keys before and after RoPE (SPEC §3)
///   key_value_statistic                  a rolling statistic of each sequence's keys and values (SPEC §4)
///   hidden_states                        one score per token from two hidden-state bands (SPEC §4)
///   reconstruction                       nothing per token: a probe step after the prompt (SPEC §10),
///                                        which Needs::reconstruction describes and the engine runs
///   none                                 nothing: the score comes from the cache itself
/// Per-layer kinds write [Hkv, T] for a layer's new tokens (Cache::append's log_beta); the
/// hidden-state kind writes [T] once per step, which the engine gives every (layer, kv head)
/// (broadcast_token_scores). Rolling state is kept per sequence; drop() forgets a finished one.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/rope.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/gate/load.hpp"
#include "kvpolicy/gate/write_gate.hpp"
#include "kvpolicy/parts/score/epiphany.hpp"
#include "kvpolicy/parts/score/kvstats.hpp"
#include "kvpolicy/registry/policy.hpp"

namespace kvpolicy::inputs {

/// The model a producer scores for: the cache's shape, the hidden size D and, for a policy that reads
/// hidden-state bands (SPEC §4), how many hidden states L' the caller gives ([L', T, D], HF
/// output_hidden_states indexing); 0 means L + 1 (the embeddings and every layer's output).
struct ModelShape {
  CacheShape cache;
  int hidden = 0;  ///< D, the width of the normed input and of the hidden states
  int hidden_states = 0;  ///< L'; 0 = L + 1
};

/// The RoPE layout a producer expects its keys in (core/rope.hpp).
using kvpolicy::RopeLayout;

/// The probe an engine runs once the prompt is in the cache, before the first token after it
/// (SPEC §10; Inputs::reconstruction), as one probe step (Cache::open_probe) of these tokens: the
/// instruction's, then the chat template's assistant header where the engine applies one ("\n"
/// where it does not), then the prompt's own tokens from position `prefix` on.
struct ReconstructionProbe {
  std::string_view instruction;
  std::int64_t prefix = 0;
};

/// What a producer reads from the forward pass. An engine passes these and may leave the rest empty.
struct Needs {
  bool normed_input = false;   ///< the layer's attention input after its norm, [T, D]
  bool keys_pre_rope = false;  ///< the layer's new keys before RoPE, [Hkv, T, d]
  bool keys = false;           ///< after RoPE, as the cache stores them, [Hkv, T, d]
  bool values = false;         ///< [Hkv, T, d]
  /// Two hidden-state indices (HF output_hidden_states indexing: 0 = the embeddings, L = the final
  /// norm's output), or none.
  std::optional<std::array<int, 2>> bands;
  /// The RoPE layout the producer expects its keys in (a write gate's file says which it was
  /// trained in; an engine in the other layout reorders the keys it passes).
  RopeLayout key_layout = RopeLayout::any;
  /// The probe the engine runs after the prompt, or none.
  std::optional<ReconstructionProbe> reconstruction;

  bool per_layer() const { return normed_input || keys_pre_rope || keys || values; }
  bool per_token() const { return bands.has_value(); }
  bool any() const { return per_layer() || per_token(); }
};

/// What one layer of a step offers for one sequence's T new tokens; a producer reads what its
/// Needs names.
struct LayerActivations {
  View<const float, 2> normed_input{};   ///< [T, D]
  View<const float, 3> keys_pre_rope{};  ///< [Hkv, T, d]
  View<const float, 3> keys{};           ///< [Hkv, T, d], after RoPE
  View<const float, 3> values{};         ///< [Hkv, T, d]
};

/// The producer of one policy's inputs, for every sequence of a cache. Copies share their state.
class Producer {
 public:
  using LayerFn = std::function<void(std::int64_t seq, int layer, const LayerActivations&, View<float, 2> out)>;
  using TokenFn = std::function<void(std::int64_t seq, View<const float, 2> h_a, View<const float, 2> h_b,
                                     std::span<float> out)>;

  /// The producer of a policy that reads nothing (registry::Inputs::none).
  Producer() = default;
  Producer(Needs needs, LayerFn layer, TokenFn tokens, std::function<void(std::int64_t)> drop)
      : needs_(std::move(needs)), layer_(std::move(layer)), tokens_(std::move(tokens)), drop_(std::move(drop)) {}

  const Needs& needs() const { return needs_; }

  /// One layer's new tokens of sequence `seq` -> out [Hkv, T]. Layers in order, within each step.
  void layer(std::int64_t seq, int layer, const LayerActivations& a, View<float, 2> out) const {
    require(static_cast<bool>(layer_), "inputs::Producer: this policy's inputs are not per layer (needs() says what it reads)");
    layer_(seq, layer, a, out);
  }
  /// A step's tokens of sequence `seq` from the hidden states of bands A and B [T, D] -> out [T].
  void tokens(std::int64_t seq, View<const float, 2> h_a, View<const float, 2> h_b, std::span<float> out) const {
    require(static_cast<bool>(tokens_), "inputs::Producer: this policy's inputs are not per token (needs() says what it reads)");
    tokens_(seq, h_a, h_b, out);
  }
  /// Forgets sequence `seq`'s rolling state (a sequence that ended, or one that starts over); not
  /// while a step of that sequence runs. Different sequences may step on different threads.
  void drop(std::int64_t seq) const {
    if (drop_) drop_(seq);
  }

 private:
  Needs needs_;
  LayerFn layer_;
  TokenFn tokens_;
  std::function<void(std::int64_t)> drop_;
};

namespace detail {

/// One rolling state per sequence, made on its first use (engines step sequences on several threads).
template <class State>
class PerSequence {
 public:
  template <class Make>
  explicit PerSequence(Make make) : make_(std::move(make)) {}
  State& operator()(std::int64_t seq) {
    const std::lock_guard lock(mutex_);
    auto it = states_.find(seq);
    if (it == states_.end()) it = states_.emplace(seq, std::make_unique<State>(make_())).first;
    return *it->second;
  }
  void drop(std::int64_t seq) {
    const std::lock_guard lock(mutex_);
    states_.erase(seq);
  }

 private:
  std::function<State()> make_;
  std::mutex mutex_;
  std::map<std::int64_t, std::unique_ptr<State>> states_;
};

inline void require_given(const View<const float, 2>& x, std::string_view name) {
  require(x.data != nullptr, "inputs::Producer: this policy reads the layer's ", name, ", which was not given");
}
inline void require_given(const View<const float, 3>& x, std::string_view name) {
  require(x.data != nullptr, "inputs::Producer: this policy reads the layer's ", name, ", which was not given");
}

}  // namespace detail

/// What policy P reads, from its option values alone (before a model is known: an engine installs
/// its hooks by it). Refuses a gated policy given no gate file.
template <registry::Policy P>
Needs needs(const registry::Values& v) {
  using registry::Inputs;
  constexpr bool gated = P::inputs == Inputs::retention_gate || P::inputs == Inputs::tied_retention_gate ||
                         P::inputs == Inputs::write_gate || P::inputs == Inputs::surrogate;
  if constexpr (gated)
    require(!v.text("gate").empty(), "policy ", P::name,
            " needs its trained gate: --gate FILE (gate= in Python), a safetensors file under SPEC's tensor names");
  Needs n;
  if constexpr (P::inputs == Inputs::retention_gate || P::inputs == Inputs::tied_retention_gate ||
                P::inputs == Inputs::surrogate) {
    n.normed_input = true;
  } else if constexpr (P::inputs == Inputs::write_gate) {
    n.keys_pre_rope = n.keys = true;
    // the layout the gate was trained in (its file's metadata; adjacent, kvpolicy-lm's, if unsaid)
    const auto meta = safetensors::File::read(v.text("gate")).metadata();
    const auto it = meta.find("rope_layout");
    const std::string layout = it == meta.end() ? "adjacent" : it->second;
    require(layout == "adjacent" || layout == "half", "policy ", P::name, ": the gate '", v.text("gate"),
            "' says rope_layout '", layout, "'; it must be adjacent or half");
    n.key_layout = layout == "half" ? RopeLayout::half : RopeLayout::adjacent;
  } else if constexpr (P::inputs == Inputs::key_value_statistic) {
    n.keys = n.values = true;
  } else if constexpr (P::inputs == Inputs::hidden_states) {
    n.bands = std::array{static_cast<int>(v.integer("band-a")), static_cast<int>(v.integer("band-b"))};
  } else if constexpr (P::inputs == Inputs::reconstruction) {
    n.reconstruction = ReconstructionProbe{P::probe_instruction, v.integer("prefix")};
  } else {
    static_assert(P::inputs == Inputs::none, "inputs::needs: a registry::Inputs without a producer");
  }
  return n;
}

/// The producer of policy P's inputs for `model`, from its option values (the trained gate's file
/// for the gated kinds: refused when none is given). Throws kvpolicy::Error on a bad value, naming it.
template <registry::Policy P>
Producer producer(const registry::Values& v, const ModelShape& model) {
  using registry::Inputs;
  const CacheShape shape = model.cache;
  shape.validate();
  const int L = shape.layers, H = shape.kv_heads, d = shape.head_dim, D = model.hidden;
  constexpr bool reads_hidden = P::inputs == Inputs::retention_gate || P::inputs == Inputs::tied_retention_gate ||
                               P::inputs == Inputs::surrogate || P::inputs == Inputs::hidden_states;
  if constexpr (reads_hidden)  // the width of the normed input or of the hidden states
    require(D >= 1, "inputs::producer: policy ", P::name, ": the hidden size D = ", D, " must be >= 1");
  Needs n = needs<P>(v);

  if constexpr (P::inputs == Inputs::retention_gate || P::inputs == Inputs::tied_retention_gate ||
                P::inputs == Inputs::surrogate) {
    // SPEC §1, §2: log beta from the gate on the layer's normed input; §11: KVzap's predicted score
    auto g = P::inputs == Inputs::surrogate
                 ? gate::load_surrogate(v.text("gate"), L, D, H)
                 : gate::load_retention_gate(v.text("gate"), L, D, H, P::inputs == Inputs::tied_retention_gate);
    return {n,
            [g, D](std::int64_t, int l, const LayerActivations& a, View<float, 2> out) {
              detail::require_given(a.normed_input, "normed input");
              require_shape(a.normed_input, {out.dim(1), D}, "inputs::Producer: normed input");
              g(l, a.normed_input, out);
            },
            {}, {}};
  } else if constexpr (P::inputs == Inputs::write_gate) {  // SPEC §3: g on the keys before and after RoPE
    auto g = std::make_shared<const gate::WriteGate>(gate::WriteGate::load(
        safetensors::File::read(v.text("gate")), {.layers = L, .kv_heads = H, .head_dim = d}));
    return {n,
            [g](std::int64_t, int l, const LayerActivations& a, View<float, 2> out) {
              detail::require_given(a.keys_pre_rope, "keys before RoPE");
              detail::require_given(a.keys, "keys");
              g->forward(l, a.keys_pre_rope, a.keys, out);
            },
            {}, {}};
  } else if constexpr (P::inputs == Inputs::key_value_statistic) {  // SPEC §4: one tracker per sequence
    auto trackers = std::make_shared<detail::PerSequence<kvstats::Tracker>>(
        [shape] { return kvstats::Tracker(shape, kvstats::Config{P::statistic, 64}); });
    return {n,
            [trackers](std::int64_t seq, int l, const LayerActivations& a, View<float, 2> out) {
              detail::require_given(a.keys, "keys");
              detail::require_given(a.values, "values");
              (*trackers)(seq).push(l, a.keys, a.values, out);
            },
            {}, [trackers](std::int64_t seq) { trackers->drop(seq); }};
  } else if constexpr (P::inputs == Inputs::hidden_states) {  // SPEC §4: one signal per sequence
    // the bands index the hidden states the caller gives, not the model's layers: a trace may hold
    // more or fewer than L + 1 of them (docs/replay.md, hidden_states [L', T, D])
    const auto [a, b] = *n.bands;
    const int given = model.hidden_states > 0 ? model.hidden_states : L + 1;
    require(a >= 0 && a < given && b >= 0 && b < given, "policy ", P::name, ": --band-a ", a, " and --band-b ", b,
            " must be hidden-state indices in [0, ", given - 1, "] of the L' = ", given,
            " hidden states given (0 = the embeddings)");
    epiphany::SignalConfig config;
    config.band_a = a;
    config.band_b = b;
    config.variant = P::variant;
    auto signals = std::make_shared<detail::PerSequence<epiphany::Signal>>([config, D] { return epiphany::Signal(config, D); });
    return {n, {},
            [signals](std::int64_t seq, View<const float, 2> h_a, View<const float, 2> h_b, std::span<float> out) {
              (*signals)(seq).push(h_a, h_b, out);
            },
            [signals](std::int64_t seq) { signals->drop(seq); }};
  } else {  // the probe is the engine's to run (Needs::reconstruction); nothing per token
    static_assert(P::inputs == Inputs::none || P::inputs == Inputs::reconstruction,
                  "inputs::producer: a registry::Inputs without a producer");
    return Producer(n, {}, {}, {});
  }
}

}  // namespace kvpolicy::inputs
