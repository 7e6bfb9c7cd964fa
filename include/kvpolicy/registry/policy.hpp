/// \file
/// kvpolicy/registry/policy.hpp — what a registered policy declares (kvpolicy/policies/NAME.hpp),
/// as kvpress's presses do: its name, a line of help, the options it takes with their defaults and
/// help text, the input source its entries' scores come from (inputs/source.hpp), and a factory
/// that builds its Cache.
/// The tools (kvpolicy-lm, kvpolicy-replay, kvpolicy-quality) and the tests iterate the
/// registry (kvpolicy/registry.hpp) instead of naming policies.
///
///   struct tova {
///     static constexpr std::string_view name = "tova", help = "TOVA: ...";
///     static constexpr std::tuple fields{field::budget<BaselineConfig>, field::buffer<BaselineConfig>.with_default(1)};
///     static constexpr auto options = options_of(fields, option::mode);  // registry/fields.hpp
///     using inputs = kvpolicy::inputs::None;  // inputs/sources.hpp, or a source of the policy's own
///     template <class Backend, class Alloc, class F>
///     static decltype(auto) make(const Values& v, const CacheShape& shape, Alloc pool, F&& f);  // f(cache)
///   };
#pragma once

#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/rule.hpp"

namespace kvpolicy::registry {

/// How an option's value is read from its text.
enum class Kind : std::uint8_t { integer, real, choice, path };

/// One option of a policy: its flag is --name. `fallback` is the default (a choice's index into
/// `choices`; a path's default is empty). Stated once, here, for every tool.
struct Option {
  constexpr Option(std::string_view name_, Kind kind_, double fallback_, std::string_view help_,
                   std::array<std::string_view, 4> choices_ = {})
      : name(name_), kind(kind_), fallback(fallback_), help(help_), choices(choices_) {}

  std::string_view name;
  Kind kind = Kind::integer;
  double fallback = 0.0;
  std::string_view help;
  std::array<std::string_view, 4> choices{};
  /// The least value the option takes, and the symbol its error names (SPEC's: M, B, S, w).
  double minimum = -1.0e300;
  std::string_view symbol;
  /// The key a tool's output records the option under (empty: the name with '-' as '_').
  std::string_view key;

  constexpr Option recorded_as(std::string_view k) const {
    Option o = *this;
    o.key = k;
    return o;
  }
  std::string record_key() const {
    std::string k(key.empty() ? name : key);
    for (char& c : k)
      if (c == '-') c = '_';
    return k;
  }

  constexpr Option at_least(double least, std::string_view sym) const {
    Option o = *this;
    o.minimum = least;
    o.symbol = sym;
    return o;
  }
  constexpr Option with_default(double value) const {
    Option o = *this;
    o.fallback = value;
    return o;
  }
  constexpr Option with_help(std::string_view text) const {
    Option o = *this;
    o.help = text;
    return o;
  }
  /// The default as the command line would give it.
  std::string default_text() const {
    switch (kind) {
      case Kind::choice: return std::string(choices[static_cast<std::size_t>(fallback)]);
      case Kind::path: return "";
      case Kind::integer: return std::to_string(static_cast<std::int64_t>(fallback));
      case Kind::real: break;
    }
    std::string s = std::to_string(fallback);
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
    return s;
  }
};

/// The options most policies share (SPEC §1 budget and buffer, §5 sinks and window).
namespace option {
inline constexpr Option budget =
    Option{"budget", Kind::integer, evict::default_budget, "M, entries kept per (layer, kv head)"}.at_least(1, "M");
inline constexpr Option buffer =
    Option{"buffer", Kind::integer, evict::default_buffer, "B: a head evicts once it holds M + B, back to M"}.at_least(1, "B");
inline constexpr Option sinks =
    Option{"sinks", Kind::integer, 0, "S, the oldest entries of every head, protected"}.at_least(0, "S");
inline constexpr Option window =
    Option{"window", Kind::integer, 0, "w, the newest entries of every head, protected"}.at_least(0, "w");
inline constexpr Option threshold{"threshold", Kind::real, 0,
                                  "alpha: keep every entry scoring >= log(alpha) instead of a top-M (0: off)"};
inline constexpr Option min_tokens =
    Option{"min-tokens", Kind::integer, 0, "F, the threshold variant's floor: each head keeps at least its F best"}
        .at_least(0, "F");
inline constexpr Option gate{"gate", Kind::path, 0, "the trained gate, a safetensors file under SPEC's tensor names"};
/// The token-level mode a policy offers beside its per-head one (SPEC §8; policies/common/token_level.hpp).
inline constexpr Option mode{"mode", Kind::choice, 0,
                             "per-head: each (layer, kv head) keeps its own M; union: a token leaves every head at "
                             "once, M tokens per sequence",
                             {"per-head", "union"}};
/// Options that describe the model rather than the policy: an engine that knows its model fills
/// them (registry::Selection::describe_model), a value the user gives wins.
inline constexpr Option rope_theta =
    Option{"rope-theta", Kind::real, 10000, "the model's RoPE base theta (an engine fills it from its model)"}.at_least(1, "theta");
inline constexpr Option rope_layout{"rope-layout", Kind::choice, 0,
                                    "the model's RoPE pairs: half (transformers) or adjacent (llama.cpp); an engine fills it",
                                    {"half", "adjacent"}};
inline constexpr std::array<std::string_view, 2> model_options{"rope-theta", "rope-layout"};
}  // namespace option

/// The option values a policy is built from: what the user gave, checked against the policy's
/// options (kind, and that the policy takes it), the defaults for the rest.
class Values {
 public:
  /// `given`: option name -> text. Refuses an option the policy does not take, or a value of the
  /// wrong kind, naming both.
  Values(std::string_view policy, std::span<const Option> options, const std::map<std::string, std::string, std::less<>>& given)
      : policy_(policy) {
    for (const auto& [name, text] : given) {
      const Option* o = find(options, name);
      require(o != nullptr, "--", name, " does not apply to policy ", policy);
      set(*o, text);
    }
    for (const Option& o : options) {
      const std::string name(o.name);
      if (!given.contains(o.name)) {
        number_[name] = o.fallback;
        if (o.kind == Kind::choice || o.kind == Kind::path) text_[name] = o.default_text();
      }
    }
  }

  std::string_view policy() const { return policy_; }
  bool given(std::string_view name) const { return given_.contains(name); }
  /// Whether the policy takes the option (given or at its default).
  bool takes(std::string_view name) const { return number_.contains(name); }
  std::int64_t integer(std::string_view name) const { return static_cast<std::int64_t>(number(name)); }
  double real(std::string_view name) const { return number(name); }
  /// A choice's index into the option's choices (text() gives its name).
  std::size_t choice(std::string_view name) const { return static_cast<std::size_t>(number(name)); }
  const std::string& text(std::string_view name) const {
    const auto it = text_.find(name);
    require(it != text_.end(), "policy ", policy_, " has no option --", name);
    return it->second;
  }
 private:
  static const Option* find(std::span<const Option> options, std::string_view name) {
    for (const Option& o : options)
      if (o.name == name) return &o;
    return nullptr;
  }
  double number(std::string_view name) const {
    const auto it = number_.find(name);
    require(it != number_.end(), "policy ", policy_, " has no option --", name);
    return it->second;
  }
  void set(const Option& o, const std::string& text) {
    const std::string name(o.name);
    given_[name] = text;
    switch (o.kind) {
      case Kind::path:
        text_[name] = text;
        number_[name] = 0;
        return;
      case Kind::choice:
        for (std::size_t i = 0; i < o.choices.size() && !o.choices[i].empty(); ++i)
          if (o.choices[i] == text) {
            text_[name] = text;
            number_[name] = static_cast<double>(i);
            return;
          }
        fail("--", name, " '", text, "' must be ", choices(o));
      case Kind::integer:
      case Kind::real: {
        double x = 0.0;
        std::size_t used = 0;
        try {
          x = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        require(used == text.size() && used > 0 && std::isfinite(x), "--", name, ": '", text, "' is not a number");
        require(o.kind == Kind::real || (std::abs(x) < 9.0e15 && x == std::floor(x)), "--", name, ": '", text,
                "' is not an integer");
        require(x >= o.minimum, "--", name, o.symbol.empty() ? "" : " ", o.symbol, o.symbol.empty() ? " " : " = ", text,
                " must be >= ", o.minimum);
        number_[name] = x;
        return;
      }
    }
  }
  static std::string choices(const Option& o) {  // "a or b", "a, b or c"
    std::size_t n = 0;
    while (n < o.choices.size() && !o.choices[n].empty()) ++n;
    std::string s;
    for (std::size_t i = 0; i < n; ++i) {
      if (i > 0) s += i + 1 == n ? " or " : ", ";
      s += o.choices[i];
    }
    return s;
  }

  std::string policy_;
  std::map<std::string, std::string, std::less<>> given_, text_;
  std::map<std::string, double, std::less<>> number_;
};

/// Whether the values build the policy's token-level mode (SPEC §8: option::mode is union).
inline bool token_level(const Values& v) { return v.takes(option::mode.name) && v.text(option::mode.name) == "union"; }

/// Several policies from one file (a family sharing its code, e.g. the KV statistics).
template <class... P>
struct family {};

/// The Scorer types a policy's make() may build (`using scorers = registry::scorers<...>;`): what
/// the registry reads a policy's capabilities from without building it (registry.hpp,
/// over_engine_storage). tests/test_engine_owned.cpp builds every policy and checks that its
/// Scorer is one of these.
template <class... S>
struct scorers {
  static_assert(sizeof...(S) > 0, "registry::scorers: name the Scorer types the policy's make() builds");
};

/// A registered policy (kvpolicy/policies/NAME.hpp).
template <class P>
concept Policy = requires {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::help } -> std::convertible_to<std::string_view>;
  { std::span<const Option>(P::options) };
  { P::inputs::name } -> std::convertible_to<std::string_view>;  // its input source (inputs/source.hpp)
  typename P::scorers;
};

/// Whether policy P states that no cache of it runs over engine-owned K/V (`static constexpr bool
/// over_engine_storage = false`: WG-KV, whose ring masks the attention); registry.hpp's
/// over_engine_storage reads it beside what its Scorers read.
template <class P>
inline constexpr bool refuses_engine_storage_v = requires { requires !P::over_engine_storage; };

/// Whether policy P compresses the prompt the engine declares (it states `static constexpr bool
/// needs_prompt_length = true`: SnapKV, AdaKV, PyramidKV, Expected Attention): read by its value,
/// false where it states none or states false.
template <class P>
inline constexpr bool needs_prompt_length_v = requires { requires P::needs_prompt_length; };

}  // namespace kvpolicy::registry
