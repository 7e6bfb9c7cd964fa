// gate/: the TRIM-KV retention gate and the DBTrimKV tied gate against naive loops (SPEC §1–2),
// weights loaded by their SPEC names from F32, F16 and BF16 files, and the load errors.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gate_layouts.hpp"
#include "kvpolicy/gate/load.hpp"
#include "kvpolicy/gate/retention_gate.hpp"
#include "kvpolicy/gate/rg10_gate.hpp"
#include "kvpolicy/gate/tied_gate.hpp"

using namespace kvpolicy;
namespace st = kvpolicy::safetensors;

namespace {

std::vector<float> randn(std::mt19937_64& rng, std::size_t n, float scale = 0.3f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}
float round_to(st::DType t, float x) {
  return t == st::DType::F16 ? to_float(from_float<half>(x)) : t == st::DType::BF16 ? to_float(from_float<bfloat16>(x)) : x;
}

}  // namespace

TEST_CASE("TRIM-KV retention gate = logsigmoid(W2 act(W1 x + b1) + b), batched and per token") {
  const int L = 2, D = 12, I = 16, H = 3, T = 5;
  std::mt19937_64 rng(17);
  for (auto dtype : {st::DType::F32, st::DType::F16, st::DType::BF16})
    for (auto act : {gate::Activation::silu, gate::Activation::gelu}) {
      st::Writer w;
      std::vector<std::vector<float>> W1, b1, W2, b;
      for (int l = 0; l < L; ++l) {
        W1.push_back(randn(rng, I * D));
        b1.push_back(randn(rng, I));
        W2.push_back(randn(rng, H * I));
        b.push_back(randn(rng, H, 1.0f));
        for (auto& x : b.back()) x += 9.0f;  // SPEC §1: the bias is initialised at 8..10
        const auto p = gate::RetentionGate::prefix(l);
        w.add_f32_as(p + "linear1.weight", dtype, {I, D}, W1.back());
        w.add_f32_as(p + "linear1.bias", dtype, {I}, b1.back());
        w.add_f32_as(p + "linear2.weight", dtype, {H, I}, W2.back());
        w.add_f32_as(p + "bias", dtype, {H}, b.back());
      }
      const auto g = gate::RetentionGate::load(st::File::parse(w.bytes()), {L, D, H, I, act});
      const auto x = randn(rng, T * D, 1.0f);
      for (int l = 0; l < L; ++l) {
        std::vector<float> lb(H * T);
        g.forward(l, View<const float, 2>(x.data(), {T, D}), View<float, 2>(lb.data(), {H, T}));
        for (int t = 0; t < T; ++t) {
          std::vector<double> u(I);
          for (int i = 0; i < I; ++i) {
            double s = round_to(dtype, b1[l][i]);
            for (int c = 0; c < D; ++c) s += double(round_to(dtype, W1[l][i * D + c])) * x[t * D + c];
            u[i] = act == gate::Activation::silu ? s / (1 + std::exp(-s)) : 0.5 * s * (1 + std::erf(s / std::sqrt(2.0)));
          }
          float one[H];
          g.forward(l, View<const float, 2>(x.data() + t * D, {1, D}), View<float, 2>(one, {H, 1}));
          for (int h = 0; h < H; ++h) {
            double z = round_to(dtype, b[l][h]);
            for (int i = 0; i < I; ++i) z += double(round_to(dtype, W2[l][h * I + i])) * u[i];
            const double want = -std::log1p(std::exp(-z));
            CHECK(lb[h * T + t] == doctest::Approx(want).epsilon(1e-4).scale(1e-3));
            CHECK(one[h] == doctest::Approx(lb[h * T + t]).epsilon(1e-6));  // a decode token = the T = 1 chunk
          }
        }
      }
    }
}

namespace {
// An rg10 checkpoint (SPEC §2, the authors' names): per layer linear1, linear2; the tied linear3 and
// bias written under every layer's name, as the authors' state dicts hold them.
struct Rg10Weights {
  std::vector<std::vector<float>> W1, b1, W2, b2;
  std::vector<float> W3, b;
};
Rg10Weights rg10_file(std::mt19937_64& rng, st::Writer& w, int L, int D, int I, int H, st::DType dtype = st::DType::F32) {
  Rg10Weights r;
  r.W3 = randn(rng, static_cast<std::size_t>(H * I));
  r.b = randn(rng, static_cast<std::size_t>(H), 1.0f);
  for (auto& x : r.b) x += 9.0f;
  for (int l = 0; l < L; ++l) {
    r.W1.push_back(randn(rng, static_cast<std::size_t>(I * D)));
    r.b1.push_back(randn(rng, static_cast<std::size_t>(I)));
    r.W2.push_back(randn(rng, static_cast<std::size_t>(I * I)));
    r.b2.push_back(randn(rng, static_cast<std::size_t>(I)));
    const auto p = gate::Rg10Gate::prefix(l);
    w.add_f32_as(p + "linear1.weight", dtype, {I, D}, r.W1.back());
    w.add_f32_as(p + "linear1.bias", dtype, {I}, r.b1.back());
    w.add_f32_as(p + "linear2.weight", dtype, {I, I}, r.W2.back());
    w.add_f32_as(p + "linear2.bias", dtype, {I}, r.b2.back());
    w.add_f32_as(p + "linear3.weight", dtype, {H, I}, r.W3);
    w.add_f32_as(p + "bias", dtype, {H}, r.b);
  }
  return r;
}
}  // namespace

TEST_CASE("DBTrimKV rg10 gate (the authors' checkpoints): two-layer MLP per layer, tied readout, against naive loops") {
  const int L = 3, D = 10, I = 12, H = 3, T = 4;
  std::mt19937_64 rng(29);
  for (auto dtype : {st::DType::F32, st::DType::BF16})
    for (auto act : {gate::Activation::silu, gate::Activation::gelu}) {
      st::Writer w;
      const auto r = rg10_file(rng, w, L, D, I, H, dtype);
      const auto f = st::File::parse(w.bytes());
      CHECK(gate::Rg10Gate::holds(f));
      const auto g = gate::Rg10Gate::load(f, {L, D, H, I, act});
      const auto x = randn(rng, T * D, 1.0f);
      const auto a = [act](double s) {
        return act == gate::Activation::silu ? s / (1 + std::exp(-s)) : 0.5 * s * (1 + std::erf(s / std::sqrt(2.0)));
      };
      for (int l = 0; l < L; ++l) {
        std::vector<float> lb(H * T);
        g.forward(l, View<const float, 2>(x.data(), {T, D}), View<float, 2>(lb.data(), {H, T}));
        for (int t = 0; t < T; ++t) {
          std::vector<double> u1(I), u2(I);
          for (int i = 0; i < I; ++i) {
            double s = round_to(dtype, r.b1[l][i]);
            for (int c = 0; c < D; ++c) s += double(round_to(dtype, r.W1[l][i * D + c])) * x[t * D + c];
            u1[i] = a(s);
          }
          for (int i = 0; i < I; ++i) {
            double s = round_to(dtype, r.b2[l][i]);
            for (int j = 0; j < I; ++j) s += double(round_to(dtype, r.W2[l][i * I + j])) * u1[j];
            u2[i] = a(s);
          }
          float one[H];
          g.forward(l, View<const float, 2>(x.data() + t * D, {1, D}), View<float, 2>(one, {H, 1}));
          for (int h = 0; h < H; ++h) {
            double z = round_to(dtype, r.b[h]);  // the same readout in every layer
            for (int i = 0; i < I; ++i) z += double(round_to(dtype, r.W3[h * I + i])) * u2[i];
            CHECK(lb[h * T + t] == doctest::Approx(-std::log1p(std::exp(-z))).epsilon(1e-4).scale(1e-3));
            CHECK(one[h] == doctest::Approx(lb[h * T + t]).epsilon(1e-6));
          }
        }
      }
    }
}

TEST_CASE("rg10 gate: a layer whose tied copy differs is refused, naming the layer, and a paper-literal file is not rg10") {
  const int L = 3, D = 4, I = 6, H = 2;
  std::mt19937_64 rng(31);
  st::Writer w;
  auto r = rg10_file(rng, w, L, D, I, H);
  const auto good = gate::Rg10Gate::load(st::File::parse(w.bytes()), {L, D, H, I});
  CHECK_NOTHROW(good.layer(L - 1));
  CHECK_THROWS_WITH_AS(good.layer(L), "kvpolicy: Rg10Gate::layer: layer 3 out of range [0, 3)", Error);
  CHECK_THROWS_WITH_AS(good.layer(-1), doctest::Contains("layer -1 out of range"), Error);
  st::Writer edited;
  for (int l = 0; l < L; ++l) {
    const auto p = gate::Rg10Gate::prefix(l);
    edited.add_f32(p + "linear1.weight", {I, D}, r.W1[l]);
    edited.add_f32(p + "linear1.bias", {I}, r.b1[l]);
    edited.add_f32(p + "linear2.weight", {I, I}, r.W2[l]);
    edited.add_f32(p + "linear2.bias", {I}, r.b2[l]);
    auto w3 = r.W3;
    if (l == 2) w3[5] = std::nextafter(w3[5], 1.0f);  // one ulp off in layer 2's copy
    edited.add_f32(p + "linear3.weight", {H, I}, w3);
    edited.add_f32(p + "bias", {H}, r.b);
  }
  CHECK_THROWS_WITH_AS(gate::Rg10Gate::load(st::File::parse(edited.bytes()), {L, D, H, I}),
                       doctest::Contains("layer 2's tied readout"), Error);
  CHECK_THROWS_WITH_AS(gate::Rg10Gate::load(st::File::parse(w.bytes()), {L, D, H, I + 1}),
                       doctest::Contains("linear1.weight' has shape [6, 4], expected [7, 4]"), Error);
  st::Writer literal;
  literal.add_f32(gate::TiedGate::prefix(0) + "proj.weight", {H * 2, D}, randn(rng, H * 2 * D));
  CHECK_FALSE(gate::Rg10Gate::holds(st::File::parse(literal.bytes())));
}

TEST_CASE("DBTrimKV tied gate: per-layer projection, one readout shared by all layers and heads") {
  const int L = 3, D = 10, H = 2, J = 8, T = 4;
  std::mt19937_64 rng(23);
  st::Writer w;
  std::vector<std::vector<float>> Wp, bp;
  for (int l = 0; l < L; ++l) {
    Wp.push_back(randn(rng, H * J * D));
    bp.push_back(randn(rng, H * J));
    w.add_f32(gate::TiedGate::prefix(l) + "proj.weight", {H * J, D}, Wp.back());
    w.add_f32(gate::TiedGate::prefix(l) + "proj.bias", {H * J}, bp.back());
  }
  const auto wg = randn(rng, J, 1.0f);
  const std::vector<float> bg{4.0f};
  w.add_f32("retention_gate.readout.weight", {J}, wg);
  w.add_f32("retention_gate.readout.bias", {1}, bg);
  const auto g = gate::TiedGate::load(st::File::parse(w.bytes()), {L, D, H, J});
  const auto x = randn(rng, T * D, 1.0f);
  for (int l = 0; l < L; ++l) {
    std::vector<float> lb(H * T);
    g.forward(l, View<const float, 2>(x.data(), {T, D}), View<float, 2>(lb.data(), {H, T}));
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        double z = bg[0];
        for (int j = 0; j < J; ++j) {
          double s = bp[l][h * J + j];
          for (int c = 0; c < D; ++c) s += double(Wp[l][(h * J + j) * D + c]) * x[t * D + c];
          z += wg[j] * (s / (1 + std::exp(-s)));
        }
        CHECK(lb[h * T + t] == doctest::Approx(-std::log1p(std::exp(-z))).epsilon(1e-4).scale(1e-3));
        CHECK(lb[h * T + t] <= 0.0f);
      }
  }
}

TEST_CASE("load_retention_gate: a token-level section is read as the kind it holds, whichever policy asks") {
  // SPEC §8, "Gate for the layout": TRIM-KV's rg per head, the paper's tied gate under token_level.
  const int L = 2, D = 6, H = 2, I = 5, J = 4, T = 3;
  std::mt19937_64 rng(29);
  st::Writer per_head, tied;
  for (int l = 0; l < L; ++l) {
    const auto p = gate::RetentionGate::prefix(l), q = gate::TiedGate::prefix(l);
    per_head.add_f32(p + "linear1.weight", {I, D}, randn(rng, I * D));
    per_head.add_f32(p + "linear1.bias", {I}, randn(rng, I));
    per_head.add_f32(p + "linear2.weight", {H, I}, randn(rng, H * I));
    per_head.add_f32(p + "bias", {H}, randn(rng, H));
    tied.add_f32(q + "proj.weight", {H * J, D}, randn(rng, H * J * D));
    tied.add_f32(q + "proj.bias", {H * J}, randn(rng, H * J));
  }
  tied.add_f32("retention_gate.readout.weight", {J}, randn(rng, J));
  tied.add_f32("retention_gate.readout.bias", {1}, std::vector<float>{3.0f});
  auto both = testing::both_layouts(st::File::parse(per_head.bytes()), st::File::parse(tied.bytes()));
  const auto path = (std::filesystem::temp_directory_path() / "kvpolicy-token-level-tied.safetensors").string();
  both.write(path);
  const auto rg = gate::RetentionGate::load(st::File::parse(per_head.bytes()), {L, D, H, I});
  const auto literal = gate::TiedGate::load(st::File::parse(tied.bytes()), {L, D, H, J});
  const auto x = randn(rng, T * D);
  const auto run = [&](const auto& g, int l) {
    std::vector<float> out(H * T);
    g(l, View<const float, 2>(x.data(), {T, D}), View<float, 2>(out.data(), {H, T}));
    return out;
  };
  const auto forward = [](const auto& g) { return [&g](int l, auto in, auto out) { g.forward(l, in, out); }; };
  for (int l = 0; l < L; ++l) {
    CAPTURE(l);
    for (const bool tied_policy : {false, true})  // TRIM-KV's and DBTrimKV's request, token level: the tied gate
      CHECK(run(gate::load_retention_gate(path, L, D, H, tied_policy, true), l) == run(forward(literal), l));
    CHECK(run(gate::load_retention_gate(path, L, D, H, false, false), l) == run(forward(rg), l));  // TRIM-KV per head
  }
  std::filesystem::remove(path);
}

TEST_CASE("gate weights: missing tensor, wrong shape, non-finite values are named") {
  const int D = 4, I = 3, H = 2;
  st::Writer w;
  const auto p = gate::RetentionGate::prefix(0);
  w.add_f32(p + "linear1.weight", {I, D}, std::vector<float>(I * D, 0.1f));
  w.add_f32(p + "linear1.bias", {I}, std::vector<float>{0.0f, std::nanf(""), 0.0f});
  w.add_f32(p + "linear2.weight", {I, H}, std::vector<float>(I * H, 0.1f));  // transposed: wrong shape
  const auto f = st::File::parse(w.bytes());
  CHECK_THROWS_WITH_AS(gate::RetentionGate::load(f, {1, D, H, I}),
                       doctest::Contains("'model.layers.0.self_attn.retention_gate.linear1.bias' holds a non-finite value"), Error);
  st::Writer w2;
  w2.add_f32(p + "linear1.weight", {I, D}, std::vector<float>(I * D, 0.1f));
  w2.add_f32(p + "linear1.bias", {I}, std::vector<float>(I, 0.1f));
  w2.add_f32(p + "linear2.weight", {I, H}, std::vector<float>(I * H, 0.1f));
  const auto f2 = st::File::parse(w2.bytes());
  CHECK_THROWS_WITH_AS(gate::RetentionGate::load(f2, {1, D, H, I}),
                       doctest::Contains("linear2.weight' has shape [3, 2], expected [2, 3]"), Error);
  st::Writer w3;
  w3.add_f32(p + "linear1.weight", {I, D}, std::vector<float>(I * D, 0.1f));
  CHECK_THROWS_WITH_AS(gate::RetentionGate::load(st::File::parse(w3.bytes()), {1, D, H, I}),
                       doctest::Contains("tensor 'model.layers.0.self_attn.retention_gate.linear1.bias' is missing"), Error);
  CHECK_THROWS_WITH_AS(gate::TiedGate::load(f2, {1, D, H, 8}), doctest::Contains("proj.weight' is missing"), Error);
  CHECK_THROWS_WITH_AS(gate::RetentionGate::load(f2, {1, 0, H, I}), doctest::Contains("hidden = 0"), Error);
  // a hidden state with a NaN is named, not turned into a NaN log_beta
  st::Writer w4;
  w4.add_f32(p + "linear1.weight", {I, D}, std::vector<float>(I * D, 0.1f));
  w4.add_f32(p + "linear1.bias", {I}, std::vector<float>(I, 0.1f));
  w4.add_f32(p + "linear2.weight", {H, I}, std::vector<float>(I * H, 0.1f));
  w4.add_f32(p + "bias", {H}, std::vector<float>(H, 9.0f));
  const auto g = gate::RetentionGate::load(st::File::parse(w4.bytes()), {1, D, H, I});
  CHECK_THROWS_WITH_AS(gate::RetentionGate::load(st::File::parse(w4.bytes()), {2, D, H, I}),
                       doctest::Contains("'model.layers.1.self_attn.retention_gate.linear1.weight' is missing"), Error);
  std::vector<float> lb2(2 * H);
  CHECK_THROWS_WITH_AS(g.forward(1, View<const float, 2>(lb2.data(), {1, D}), View<float, 2>(lb2.data(), {H, 1})),
                       doctest::Contains("layer 1 out of range [0, 1)"), Error);
  CHECK_THROWS_WITH_AS(g.forward(0, View<const float, 2>(lb2.data(), {1, D}), View<float, 2>(lb2.data(), {H, 2})),
                       doctest::Contains("log_beta has shape [2, 2], expected [2, 1]"), Error);
  std::vector<float> x(D, 1.0f), lb(H);
  x[2] = std::nanf("");
  CHECK_THROWS_WITH_AS(g.forward(0, View<const float, 2>(x.data(), {1, D}), View<float, 2>(lb.data(), {H, 1})),
                       doctest::Contains("RetentionGate: x holds nan at flat index 2"), Error);
}

TEST_CASE("tied gate: GELU, fp16 weights, readout shape, and activation names") {
  const int D = 3, H = 2, J = 2;
  st::Writer w;
  const std::vector<float> wp{0.5f, -0.25f, 1.0f, 0.0f, 0.75f, -1.0f, 0.125f, 0.5f, -0.5f, 1.5f, 0.25f, 0.0f};
  const std::vector<float> bp{0.125f, -0.25f, 0.375f, 0.0f}, wg{1.0f, -2.0f}, bg{0.5f};
  w.add_f32_as(gate::TiedGate::prefix(0) + "proj.weight", st::DType::F16, {H * J, D}, wp);
  w.add_f32_as(gate::TiedGate::prefix(0) + "proj.bias", st::DType::F16, {H * J}, bp);
  w.add_f32_as("retention_gate.readout.weight", st::DType::BF16, {J}, wg);
  w.add_f32("retention_gate.readout.bias", {1}, bg);
  const auto f = st::File::parse(w.bytes());
  const auto g = gate::TiedGate::load(f, {1, D, H, J, gate::Activation::gelu});
  const std::vector<float> x{1.0f, -1.0f, 2.0f};
  float lb[H];
  g.forward(0, View<const float, 2>(x.data(), {1, D}), View<float, 2>(lb, {H, 1}));
  for (int h = 0; h < H; ++h) {  // every weight above is exact in fp16 and bf16
    double z = bg[0];
    for (int j = 0; j < J; ++j) {
      double s = bp[h * J + j];
      for (int c = 0; c < D; ++c) s += double(wp[(h * J + j) * D + c]) * x[c];
      z += wg[j] * 0.5 * s * (1 + std::erf(s / std::sqrt(2.0)));
    }
    CHECK(lb[h] == doctest::Approx(-std::log1p(std::exp(-z))).epsilon(1e-5));
  }
  CHECK_THROWS_WITH_AS(gate::TiedGate::load(f, {1, D, H, 3}), doctest::Contains("proj.weight' has shape [4, 3], expected [6, 3]"), Error);
  CHECK(gate::parse_activation("silu") == gate::Activation::silu);
  CHECK(gate::parse_activation("gelu") == gate::Activation::gelu);
  CHECK_THROWS_WITH_AS(gate::parse_activation("relu"), doctest::Contains("unknown activation 'relu'"), Error);
}

TEST_CASE("the valid gate files of the fuzz corpus load (so fuzz_gate reaches its forward checks)") {
  const std::string dir = std::string(KVPOLICY_SOURCE_DIR) + "/fuzz/corpus/gate/";
  for (const char* name : {"trimkv_f32", "trimkv_f16", "trimkv_bf16", "trimkv_huge_weights"}) {
    INFO(name);
    CHECK_NOTHROW(gate::RetentionGate::load(safetensors::File::read(dir + name), {2, 8, 2, 4, gate::Activation::silu}));
  }
  for (const char* name : {"dbtrimkv_f32", "dbtrimkv_bf16"}) {
    INFO(name);
    CHECK_NOTHROW(gate::TiedGate::load(safetensors::File::read(dir + name), {2, 8, 2, 4, gate::Activation::gelu}));
  }
  for (const char* name : {"trimkv_missing_layer1_bias", "trimkv_wrong_shape", "trimkv_nan_weight", "trimkv_int_dtype"}) {
    INFO(name);
    CHECK_THROWS_AS(gate::RetentionGate::load(safetensors::File::read(dir + name), {2, 8, 2, 4, gate::Activation::silu}),
                    Error);
  }
}
