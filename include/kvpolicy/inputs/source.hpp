/// \file
/// kvpolicy/inputs/source.hpp — what a policy reads from the forward pass, as a type the policy
/// names (`using inputs = ...;` in its registry entry), FlashInfer's AttentionVariant style: an
/// input source states its name, what its producer writes for each entry (Scores), what it reads
/// (`needs<P>(values)`: an engine installs its hooks by it) and how it turns that into the entries'
/// write scores (`producer<P>(values, model)`). The engines (kvpolicy-lm, kvpolicy-llama,
/// kvpolicy-replay, Python) hand a producer the tensors its Needs lists and never ask which source
/// it is, so a policy that reads a new kind of signal declares its source in its own file. The
/// sources several policies share are in inputs/sources.hpp; their producers in inputs/producer.hpp.
/// A source that reads a file given as --gate (`gated = true`) reads its tensors by name
/// (GateTensors, which inputs/producer.hpp opens: a policy file needs no file parser) and writes an
/// example of one for a model (`example_gate(sink, model, level)`), by which the tests run every
/// gated policy without naming it.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/rope.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
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
/// (SPEC §10; a source that probes, KVzip's), as one probe step (Cache::open_probe) of these tokens: the
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

  /// The producer of a policy that reads nothing (inputs::None).
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

/// What a source's producer writes for each entry: the value Cache::append takes as its write
/// score (its log_beta argument).
enum class Scores : std::uint8_t {
  none,      ///< nothing: the Cache computes the entries' scores itself; an engine passes zeros
  log_beta,  ///< log beta in (-inf, 0] from a retention gate (SPEC §1, §2)
  gate,      ///< WG-KV's g in [0, 1] (SPEC §3)
  score,     ///< a frozen score, any finite real (SPEC §4, §11)
};

/// The name of a Scores, as a tool prints it.
constexpr std::string_view name_of(Scores s) {
  switch (s) {
    case Scores::none: return "none";
    case Scores::log_beta: return "log_beta";
    case Scores::gate: return "gate";
    case Scores::score: return "score";
  }
  return "?";
}

/// An input source (the file's comment): its name and what its producer writes; `needs<P>` and
/// `producer<P>` are member templates, instantiated for the policy P that names the source.
template <class I>
concept Source = requires {
  { I::name } -> std::convertible_to<std::string_view>;
  { I::scores } -> std::convertible_to<Scores>;
};

/// The tensors of the file a gated policy's --gate names, as its source reads them. inputs/producer.hpp
/// opens the file (read_gate: safetensors, F32, F16 or BF16), so that a policy file needs no parser.
struct GateTensors {
  std::string source;  ///< the file's path, for messages
  std::map<std::string, std::string> metadata;  ///< the file's own (safetensors' __metadata__)
  std::function<bool(const std::string& name)> contains;
  std::function<std::vector<std::int64_t>(const std::string& name)> shape;  ///< a missing tensor throws, naming it
  /// The tensor as fp32; throws, naming it, when it is missing, has another shape than `shape`, or
  /// holds a value that is not finite.
  std::function<std::vector<float>(const std::string& name, const std::vector<std::int64_t>& shape)> floats;
};

/// The tensors of the file at `path`: declared here for the sources, defined in inputs/producer.hpp,
/// which a program that opens inputs includes (a template, so that a program that never opens one
/// needs no definition).
template <class = void>
GateTensors read_gate(const std::string& path);

/// Where a source's example_gate puts each fp32 tensor of the file it describes.
using GateSink =
    std::function<void(const std::string& name, const std::vector<std::int64_t>& shape, const std::vector<float>& values)>;

/// Whether source I reads the file the policy's --gate option gives (it states `static constexpr
/// bool gated = true`): read by its value, false where it states none or states false.
template <class I>
inline constexpr bool gated_v = requires { requires I::gated; };

/// Whether the engine runs a probe step of source I after the prompt (SPEC §10; it states `static
/// constexpr bool probes = true`, and its needs() describe the probe in Needs::reconstruction).
template <class I>
inline constexpr bool probes_v = requires { requires I::probes; };

/// Refuses a gated policy P given no --gate file, naming the option.
template <class P>
void require_gate(const registry::Values& v) {
  require(!v.text("gate").empty(), "policy ", P::name,
          " needs its trained gate: --gate FILE (gate= in Python), a safetensors file under SPEC's tensor names");
}

}  // namespace kvpolicy::inputs
