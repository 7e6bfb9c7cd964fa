// libFuzzer target: gate-weight loading, TRIM-KV (RetentionGate) and DBTrimKV (TiedGate), from an
// arbitrary safetensors image. The geometry is fixed (2 layers, D = 8, Hkv = 2, I = J = 4, as in the
// seed corpus); a file that does not carry exactly the SPEC tensor names and shapes, or carries a
// non-finite weight, must be refused with kvpolicy::Error. A gate that loads runs a forward pass
// whose log_beta is never positive (logsigmoid <= 0; NaN only from fp32 overflow of huge weights,
// which Cache::append then rejects).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kvpolicy/gate/retention_gate.hpp"
#include "kvpolicy/gate/tied_gate.hpp"

using namespace kvpolicy;

namespace {

constexpr int kLayers = 2, kHidden = 8, kKvHeads = 2, kInner = 4, kTokens = 3;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

template <class Gate>
void run(const Gate& g) {
  std::vector<float> x(kTokens * kHidden);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(static_cast<int>(i % 7) - 3);
  std::vector<float> lb(kKvHeads * kTokens, 1.0f);
  for (int l = 0; l < kLayers; ++l) {
    g.forward(l, View<const float, 2>(x.data(), {kTokens, kHidden}), View<float, 2>(lb.data(), {kKvHeads, kTokens}));
    for (float v : lb) check(!(v > 0.0f));
  }
  bool refused = false;
  try {
    g.forward(kLayers, View<const float, 2>(x.data(), {kTokens, kHidden}), View<float, 2>(lb.data(), {kKvHeads, kTokens}));
  } catch (const Error&) {
    refused = true;
  }
  check(refused);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::optional<safetensors::File> f;
  try {
    f.emplace(safetensors::File::parse(std::vector<std::uint8_t>(data, data + size), "fuzz"));
  } catch (const Error&) {
    return 0;
  }
  // Only loading may refuse the file; a gate that loaded must run (an Error from forward() on a
  // valid layer escapes and is reported as a crash).
  std::optional<gate::RetentionGate> trimkv;
  try {
    trimkv.emplace(gate::RetentionGate::load(*f, {kLayers, kHidden, kKvHeads, kInner, gate::Activation::silu}));
  } catch (const Error&) {
  }
  if (trimkv) run(*trimkv);
  std::optional<gate::TiedGate> tied;
  try {
    tied.emplace(gate::TiedGate::load(*f, {kLayers, kHidden, kKvHeads, kInner, gate::Activation::gelu}));
  } catch (const Error&) {
  }
  if (tied) run(*tied);
  return 0;
}
