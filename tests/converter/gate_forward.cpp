// Loads a gate from a safetensors file (as kvpolicy-convert-checkpoint and kvpolicy-train-gates write it)
// and prints its output for a fixed input, one value per line, layer by layer: [L][Hkv][T].
//   gate_forward [trimkv|dbtrimkv] FILE LAYERS HIDDEN KV_HEADS INTERMEDIATE
//   gate_forward wgkv FILE LAYERS KV_HEADS HEAD_DIM
// trimkv: TRIM-KV's gate (SPEC §1, the default), log_beta; dbtrimkv: the authors' rg10 (SPEC §2),
// log_beta; x[t][i] = sin(0.37 * (t * HIDDEN + i)). wgkv: WG-KV's write gate (SPEC §3), g, on
// k_pre[h][t][i] = sin(0.37 * n) and k_post[h][t][i] = cos(0.53 * n), n = (h * T + t) * HEAD_DIM + i.
// T = 3. The converter and training tests compute the same in torch.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvpolicy/gate/retention_gate.hpp"
#include "kvpolicy/gate/rg10_gate.hpp"
#include "kvpolicy/gate/write_gate.hpp"

int main(int argc, char** argv) {
  std::string kind = "trimkv";
  if (argc >= 2 && (std::string(argv[1]) == "trimkv" || std::string(argv[1]) == "dbtrimkv" || std::string(argv[1]) == "wgkv")) {
    kind = argv[1];
    ++argv;
    --argc;
  }
  if (kind == "wgkv" && argc == 5) {
    try {
      const int L = std::atoi(argv[2]), H = std::atoi(argv[3]), d = std::atoi(argv[4]), T = 3;
      const auto gate = kvpolicy::gate::WriteGate::load(kvpolicy::safetensors::File::read(argv[1]),
                                                        {.layers = L, .kv_heads = H, .head_dim = d});
      std::vector<float> k_pre(static_cast<std::size_t>(H * T * d)), k_post(k_pre.size()), g(static_cast<std::size_t>(H * T));
      for (std::size_t n = 0; n < k_pre.size(); ++n) {
        k_pre[n] = std::sin(0.37f * static_cast<float>(n));
        k_post[n] = std::cos(0.53f * static_cast<float>(n));
      }
      for (int l = 0; l < L; ++l) {
        gate.forward(l, kvpolicy::View<const float, 3>(k_pre.data(), {H, T, d}),
                     kvpolicy::View<const float, 3>(k_post.data(), {H, T, d}), kvpolicy::View<float, 2>(g.data(), {H, T}));
        for (float v : g) std::printf("%.9g\n", v);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gate_forward: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  if (argc != 6 || (kind != "trimkv" && kind != "dbtrimkv")) {
    std::fprintf(stderr, "usage: gate_forward [trimkv|dbtrimkv] FILE LAYERS HIDDEN KV_HEADS INTERMEDIATE\n"
                         "       gate_forward wgkv FILE LAYERS KV_HEADS HEAD_DIM\n");
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
