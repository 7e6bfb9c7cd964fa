/// \file
/// kvpolicy/policies/hidden_states.hpp — EpiKV and HS-var (SPEC §4): one frozen score per token from
/// the change of the hidden states between bands A and B, the same in every layer and head, a
/// budget K over the generated tokens, the prompt and the R newest protected
/// (policies/common/generated_budget.hpp). The engine computes the score (epiphany::Signal,
/// kvpolicy/parts/score/epiphany.hpp; inputs::HiddenStates).
#pragma once

#include <tuple>

#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/parts/score/epiphany.hpp"
#include "kvpolicy/policies/common/generated_budget.hpp"

namespace kvpolicy::policies {

namespace detail {

template <epiphany::Variant V>
struct hidden_state_signal : generated_budget {
  static constexpr auto options = registry::options_of(
      generated_budget::fields,
      registry::Option{"band-a", registry::Kind::integer, 10,
                       "hidden-state band A, HF indexing (0: the embeddings, l: after layer l-1)"},
      registry::Option{"band-b", registry::Kind::integer, 21, "hidden-state band B"});
  using inputs = kvpolicy::inputs::HiddenStates;
  static constexpr epiphany::Variant variant = V;
};

}  // namespace detail

/// EpiKV's registry entry (registry/policy.hpp): its name, help, options and make(), by which `--policy`,
/// registry::open and the Python package build it.
struct epikv : detail::hidden_state_signal<epiphany::Variant::epikv> {
  static constexpr std::string_view name = "epikv";
  static constexpr std::string_view help = "EpiKV: z-scored hidden-state change z_A - z_B, budget K generated";
};
/// HS-var's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct hs_var : detail::hidden_state_signal<epiphany::Variant::hs_var> {
  static constexpr std::string_view name = "hs-var";
  static constexpr std::string_view help = "HS-var: rolling mean of the hidden-state change, g_A - g_B";
};

/// The policies that score by the hidden states, registered together (registry::family).
using hidden_states = registry::family<epikv, hs_var>;

}  // namespace kvpolicy::policies
