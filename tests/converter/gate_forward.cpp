// Loads a retention gate from a safetensors file (as tools/convert_checkpoint.py writes it) and
// prints log_beta for a fixed input, one value per line, layer by layer: [L][Hkv][T].
//   gate_forward [trimkv|dbtrimkv] FILE LAYERS HIDDEN KV_HEADS INTERMEDIATE
// trimkv: TRIM-KV's gate (SPEC §1, the default); dbtrimkv: the authors' rg10 (SPEC §2).
// x[t][i] = sin(0.37 * (t * HIDDEN + i)), T = 3. The converter tests compute the same in torch.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvpolicy/gate/retention_gate.hpp"
#include "kvpolicy/gate/rg10_gate.hpp"

int main(int argc, char** argv) {
  std::string kind = "trimkv";
  if (argc == 7) {
    kind = argv[1];
    ++argv;
    --argc;
  }
  if (argc != 6 || (kind != "trimkv" && kind != "dbtrimkv")) {
    std::fprintf(stderr, "usage: gate_forward [trimkv|dbtrimkv] FILE LAYERS HIDDEN KV_HEADS INTERMEDIATE\n");
    return 2;
  }
  try {
    const int L = std::atoi(argv[2]), D = std::atoi(argv[3]), H = std::atoi(argv[4]), I = std::atoi(argv[5]);
    const auto file = kvpolicy::safetensors::File::read(argv[1]);
    const int T = 3;
    std::vector<float> x(static_cast<std::size_t>(T * D)), lb(static_cast<std::size_t>(H * T));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
    const auto print = [&](const auto& gate) {
      for (int l = 0; l < L; ++l) {
        gate.forward(l, kvpolicy::View<const float, 2>(x.data(), {T, D}), kvpolicy::View<float, 2>(lb.data(), {H, T}));
        for (float v : lb) std::printf("%.9g\n", v);
      }
    };
    if (kind == "trimkv")
      print(kvpolicy::gate::RetentionGate::load(file, {L, D, H, I, kvpolicy::gate::Activation::silu}));
    else
      print(kvpolicy::gate::Rg10Gate::load(file, {L, D, H, I, kvpolicy::gate::Activation::silu}));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gate_forward: %s\n", e.what());
    return 1;
  }
  return 0;
}
