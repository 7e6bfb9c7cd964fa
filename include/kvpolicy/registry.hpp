/// \file
/// kvpolicy/registry.hpp — the list of registered policies, iterated at compile time.
/// A policy registers itself by being a file under kvpolicy/policies/ whose stem names its type
/// (kvpolicy::policies::STEM, one policy or a registry::family of several); CMake writes the list of
/// those files (kvpolicy/policies/registered.inc, in the build tree and installed beside the
/// headers), so adding a policy edits no list.
#pragma once

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/registry/policy.hpp"

#if __has_include("kvpolicy/policies/registered.inc")
#include "kvpolicy/policies/registered.inc"  // one #include per policy file, and KVPOLICY_POLICY_FILES
#else
#error "kvpolicy/registry.hpp: kvpolicy/policies/registered.inc is missing: CMake writes it from the files in include/kvpolicy/policies/ (link kvpolicy::kvpolicy, or install the package)"
#endif

namespace kvpolicy::registry {

namespace detail {
template <class... T>
struct list {};
template <class L, class P>
struct add;
template <class... T, class P>
struct add<list<T...>, P> {
  using type = list<T..., P>;
};
template <class... T, class... P>
struct add<list<T...>, family<P...>> {
  using type = list<T..., P...>;
};
template <class L, class... P>
struct flatten {
  using type = L;
};
template <class L, class P, class... Rest>
struct flatten<L, P, Rest...> {
  using type = typename flatten<typename add<L, P>::type, Rest...>::type;
};
template <class F, class... P>
void each(list<P...>, F&& f) {
  (f.template operator()<P>(), ...);
}
}  // namespace detail

/// Every registered policy, in the order of their files' names.
using all = typename detail::flatten<detail::list<>, KVPOLICY_POLICY_FILES>::type;

/// Calls f.template operator()<P>() for every registered policy P.
template <class F>
void for_each(F&& f) {
  detail::each(all{}, f);
}

inline std::vector<std::string_view> names() {
  std::vector<std::string_view> out;
  for_each([&]<Policy P>() { out.push_back(P::name); });
  return out;
}

/// "a, b, c": the registered names, for an error message or a help text.
inline std::string known() {
  std::string out;
  for (const auto n : names()) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

inline bool contains(std::string_view name) {
  bool found = false;
  for_each([&]<Policy P>() { found = found || P::name == name; });
  return found;
}

/// The policies that take the option `option`, as "a, b" (empty: none).
inline std::string takers(std::string_view option) {
  std::string out;
  for_each([&]<Policy P>() {
    for (const Option& o : P::options)
      if (o.name == option) {
        if (!out.empty()) out += ", ";
        out += P::name;
      }
  });
  return out;
}

/// Whether the policy named `policy` takes `option` (false for an unknown policy).
inline bool takes(std::string_view policy, std::string_view option) {
  bool found = false;
  for_each([&]<Policy P>() {
    if (P::name == policy)
      for (const Option& o : P::options) found = found || o.name == option;
  });
  return found;
}

/// The default of `option` as text: the policy's, or where it does not take the option the first
/// registered policy's that does ("" when none does). A tool that records every option of a run
/// records these for the options its policy does not read.
inline std::string default_text(std::string_view policy, std::string_view option) {
  std::string own, first;
  bool has_own = false, has_first = false;
  for_each([&]<Policy P>() {
    for (const Option& o : P::options) {
      if (o.name != option) continue;
      if (P::name == policy) {
        own = o.default_text();
        has_own = true;
      } else if (!has_first) {
        first = o.default_text();
        has_first = true;
      }
    }
  });
  return has_own ? own : first;
}

/// Every option any registered policy takes, each once (its first declaration), in that order.
inline std::vector<Option> all_options() {
  std::vector<Option> out;
  for_each([&]<Policy P>() {
    for (const Option& o : P::options)
      if (std::none_of(out.begin(), out.end(), [&](const Option& x) { return x.name == o.name; })) out.push_back(o);
  });
  return out;
}

/// Whether the policy named `name` compresses the prompt the engine declares (a policy that states
/// needs_prompt_length: SnapKV, AdaKV); false for an unknown name.
inline bool needs_prompt_length(std::string_view name) {
  bool found = false;
  for_each([&]<Policy P>() { found = found || (P::name == name && needs_prompt_length_v<P>); });
  return found;
}

namespace detail {
template <class... S>
constexpr bool metadata_scorers(scorers<S...>) {
  return (!scorer_reads_stored_kv<S> && ...);
}
template <class... S>
constexpr bool value_readers(scorers<S...>) {
  return (scorer_reads_stored_values<S> || ...);
}
}  // namespace detail

/// Whether a Scorer policy P may build reads what only stored K/V give: the keys of stored entries
/// (KeyDiff) or the attention over them (H2O, TOVA, SnapKV, Expected Attention). Read from the
/// Scorer types P declares; nothing is built.
template <Policy P>
constexpr bool reads_stored_kv() {
  return !detail::metadata_scorers(typename P::scorers{});
}
/// The same by name (false for an unknown name).
inline bool reads_stored_kv(std::string_view name) {
  bool yes = false;
  for_each([&]<Policy P>() { yes = yes || (P::name == name && reads_stored_kv<P>()); });
  return yes;
}

/// Whether policy P runs over K/V the engine owns (storage engine_owned, SPEC §9: the cache keeps
/// metadata only): no Scorer it may build reads stored values, and it does not state otherwise
/// (WG-KV). One that reads stored keys or the attention over them (reads_stored_kv) reads the
/// engine's keys (Cache::use_engine_keys) and, where it ranks by attention, is shown the engine's
/// queries (Cache::observe); the others read their entries' metadata alone.
template <Policy P>
constexpr bool over_engine_storage() {
  return !refuses_engine_storage_v<P> && !detail::value_readers(typename P::scorers{});
}
/// The same by name (false for an unknown name).
inline bool over_engine_storage(std::string_view name) {
  bool yes = false;
  for_each([&]<Policy P>() { yes = yes || (P::name == name && over_engine_storage<P>()); });
  return yes;
}
/// The policies that run over K/V the engine owns, as "a, b".
inline std::string over_engine_storage_policies() {
  std::string out;
  for_each([&]<Policy P>() {
    if (!over_engine_storage<P>()) return;
    if (!out.empty()) out += ", ";
    out += P::name;
  });
  return out;
}

/// A policy chosen by its name and the options a user gave it (--name value), as text: what a tool
/// hands the registry. The defaults stay the policy's own (values<P>).
struct Selection {
  std::string policy;
  std::map<std::string, std::string, std::less<>> given;

  Selection& set(const std::string& option, const std::string& value) {
    given[option] = value;
    return *this;
  }
  Selection& set(const std::string& option, double value) {
    std::ostringstream s;
    s.precision(17);
    s << value;
    return set(option, s.str());
  }
  /// Sets the option when the policy takes it (a table of several policies with shared settings).
  Selection& offer(const std::string& option, double value) {
    if (takes(policy, option)) set(option, value);
    return *this;
  }
  /// Sets an option that describes the model (option::model_options: its RoPE) when the policy
  /// takes it and the user has not given it: what an engine that knows its model calls.
  Selection& describe_model(const std::string& option, const std::string& value) {
    if (takes(policy, option) && !given.contains(option)) set(option, value);
    return *this;
  }
  Selection& describe_model(const std::string& option, double value) {
    if (takes(policy, option) && !given.contains(option)) set(option, value);
    return *this;
  }
  /// An option's value as the run uses it: given, or the policy's default (else the registry's).
  std::string value(const std::string& option) const {
    const auto it = given.find(option);
    return it != given.end() ? it->second : default_text(policy, option);
  }
};

/// Whether any registered policy takes `option` (a tool forwards such a flag to the registry).
inline bool is_option(std::string_view option) { return !takers(option).empty(); }

namespace detail {
template <class F, class P, class... Rest>
decltype(auto) visit_in(list<P, Rest...>, std::string_view name, F& f) {
  if (P::name == name) return f.template operator()<P>();
  if constexpr (sizeof...(Rest) == 0)
    fail("unknown policy '", name, "' (known: ", known(), ")");
  else
    return visit_in(list<Rest...>{}, name, f);
}
}  // namespace detail

/// Calls f.template operator()<P>() for the policy named `name`, and returns what it returns (the
/// same type for every policy). An unknown name is an error that lists the known ones.
template <class F>
decltype(auto) visit(std::string_view name, F&& f) {
  return detail::visit_in(all{}, name, f);
}

/// The values of P's options from `given` (option name -> text), defaults for the rest. An option
/// P does not take is an error naming the policies that take it.
template <Policy P>
Values values(const std::map<std::string, std::string, std::less<>>& given) {
  for (const auto& [option, text] : given) {
    bool takes = false;
    for (const Option& o : P::options) takes = takes || o.name == option;
    if (takes) continue;
    const std::string users = takers(option);
    fail("--", option, " does not apply to policy ", P::name,
         users.empty() ? std::string(" (no policy takes it)") : " (it is for: " + users + ")");
  }
  return Values(P::name, std::span<const Option>(P::options), given);
}

}  // namespace kvpolicy::registry
