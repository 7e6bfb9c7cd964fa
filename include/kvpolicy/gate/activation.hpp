/// \file
/// kvpolicy/gate/activation.hpp — the gate MLPs' activations (SPEC §1: SiLU by default, GELU selectable).
#pragma once

#include <string>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/math.hpp"

namespace kvpolicy::gate {

enum class Activation { silu, gelu };

KVPOLICY_HD float activate(Activation a, float x) { return a == Activation::silu ? math::silu(x) : math::gelu(x); }

inline Activation parse_activation(const std::string& s) {
  if (s == "silu") return Activation::silu;
  if (s == "gelu") return Activation::gelu;
  fail("gate: unknown activation '", s, "' (expected silu or gelu)");
}

}  // namespace kvpolicy::gate
