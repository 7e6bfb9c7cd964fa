// Gate files of both layouts written for tests (SPEC §8, "Gate for the layout").
#pragma once

#include <string>
#include <utility>

#include "kvpolicy/gate/load.hpp"
#include "kvpolicy/gate/safetensors.hpp"

namespace kvpolicy::testing {

/// One file's tensors: PER_HEAD's under their own names, TOKEN_LEVEL's under names prefixed token_level.
inline safetensors::Writer both_layouts(const safetensors::File& per_head, const safetensors::File& token_level) {
  safetensors::Writer both;
  for (const auto& [f, prefix] : {std::pair{&per_head, std::string()}, std::pair{&token_level, std::string(gate::token_level_prefix)}})
    for (const auto& n : f->names()) both.add_f32(prefix + n, f->info(n).shape, f->floats(n));
  return both;
}

}  // namespace kvpolicy::testing
