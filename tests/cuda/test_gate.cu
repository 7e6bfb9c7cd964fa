// The retention gate on the device (cuBLAS + fused epilogues) against the CPU gate's formula
// (SPEC §1: log_beta = logsigmoid(W2 act(W1 x + b1) + b)), evaluated in double on the host, for a
// prefill chunk and a decode token, SiLU and GELU. WG-KV's write gate (SPEC §3: a per-head MLP over
// the RMS-normalised pre- and post-RoPE keys, GELU, sigmoid clamped at 1e-3) the same way.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "blas_handle.hpp"
#include "device_buffer.hpp"
#include "kvpolicy/cuda/kernels/retention_gate.cuh"
#include "kvpolicy/cuda/kernels/write_gate.cuh"

namespace kp = kvpolicy;
namespace kc = kvpolicy::gpu;
using cudatest::DeviceBuffer;

namespace {

double act_ref(kp::gate::Activation a, double x) {
  return a == kp::gate::Activation::silu ? x / (1.0 + std::exp(-x)) : 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double logsigmoid_ref(double z) { return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z)); }

}  // namespace

TEST_CASE("retention_gate_forward matches the gate's formula") {
  cudatest::BlasHandle blas;
  const cublasHandle_t handle = blas.get();
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal;
  for (auto act : {kp::gate::Activation::silu, kp::gate::Activation::gelu})
    for (std::int64_t T : {1, 7, 300}) {
      const int D = 96, I = 64, H = 4;
      std::vector<float> w1(I * D), b1(I), w2(H * I), b(H), x(T * D);
      for (auto& v : w1) v = normal(rng) * 0.1f;
      for (auto& v : b1) v = normal(rng) * 0.1f;
      for (auto& v : w2) v = normal(rng) * 0.2f;
      for (auto& v : b) v = normal(rng) + 2.0f;
      for (auto& v : x) v = normal(rng);
      DeviceBuffer<float> dw1(w1), db1(b1), dw2(w2), db(b), dx(x), out(std::size_t(H) * T);
      out.poison(0xFF);
      kc::RetentionGateWeights w{dw1.get(), db1.get(), dw2.get(), db.get(), D, I, H, act};
      std::size_t bytes = 0;
      kc::retention_gate_forward(nullptr, bytes, handle, w, dx.get(), T, out.get(), nullptr);
      DeviceBuffer<unsigned char> ws(bytes);
      kc::retention_gate_forward(ws.get(), bytes, handle, w, dx.get(), T, out.get(), nullptr);
      cudatest::sync();
      const auto got = out.download();
      for (std::int64_t t = 0; t < T; ++t) {
        std::vector<double> u(I);
        for (int i = 0; i < I; ++i) {
          double s = b1[i];
          for (int c = 0; c < D; ++c) s += double(w1[i * D + c]) * x[t * D + c];
          u[i] = act_ref(act, s);
        }
        for (int h = 0; h < H; ++h) {
          double z = b[h];
          for (int i = 0; i < I; ++i) z += double(w2[h * I + i]) * u[i];
          const double want = logsigmoid_ref(z);
          INFO("token ", t, ", head ", h, ", T = ", T);
          CHECK(std::abs(got[h * T + t] - want) <= 1e-5 * std::max(1.0, std::abs(want)));
        }
      }
    }
}

TEST_CASE("rg10_gate_forward matches the authors' rg10 gate (gate::Rg10Gate's formula, SPEC §2)") {
  cudatest::BlasHandle blas;
  const cublasHandle_t handle = blas.get();
  std::mt19937_64 rng(13);
  std::normal_distribution<float> normal;
  for (auto act : {kp::gate::Activation::silu, kp::gate::Activation::gelu})
    for (std::int64_t T : {1, 6, 129}) {
      const int D = 48, I = 40, H = 3;
      std::vector<float> w1(I * D), b1(I), w2(I * I), b2(I), w3(H * I), b(H), x(T * D);
      for (auto* v : {&w1, &w2, &w3})
        for (auto& e : *v) e = normal(rng) * 0.15f;
      for (auto* v : {&b1, &b2})
        for (auto& e : *v) e = normal(rng) * 0.1f;
      for (auto& v : b) v = normal(rng) + 2.0f;
      for (auto& v : x) v = normal(rng);
      DeviceBuffer<float> dw1(w1), db1(b1), dw2(w2), db2(b2), dw3(w3), db(b), dx(x), out(std::size_t(H) * T);
      out.poison(0xFF);
      kc::Rg10GateWeights w{dw1.get(), db1.get(), dw2.get(), db2.get(), dw3.get(), db.get(), D, I, H, act};
      std::size_t bytes = 0;
      kc::rg10_gate_forward(nullptr, bytes, handle, w, dx.get(), T, out.get(), nullptr);
      DeviceBuffer<unsigned char> ws(bytes);
      kc::rg10_gate_forward(ws.get(), bytes, handle, w, dx.get(), T, out.get(), nullptr);
      cudatest::sync();
      const auto got = out.download();
      for (std::int64_t t = 0; t < T; ++t) {
        std::vector<double> u1(I), u2(I);
        for (int i = 0; i < I; ++i) {
          double s = b1[i];
          for (int c = 0; c < D; ++c) s += double(w1[i * D + c]) * x[t * D + c];
          u1[i] = act_ref(act, s);
        }
        for (int i = 0; i < I; ++i) {
          double s = b2[i];
          for (int j = 0; j < I; ++j) s += double(w2[i * I + j]) * u1[j];
          u2[i] = act_ref(act, s);
        }
        for (int h = 0; h < H; ++h) {
          double z = b[h];
          for (int i = 0; i < I; ++i) z += double(w3[h * I + i]) * u2[i];
          const double want = logsigmoid_ref(z);
          INFO("token ", t, ", head ", h, ", T = ", T);
          CHECK(std::abs(got[h * T + t] - want) <= 1e-5 * std::max(1.0, std::abs(want)));
        }
      }
    }
  kc::Rg10GateWeights bad;
  std::size_t bytes = 0;
  CHECK_THROWS_WITH(kc::rg10_gate_forward(nullptr, bytes, nullptr, bad, nullptr, 1, nullptr, nullptr),
                    doctest::Contains("hidden = 0"));
}

TEST_CASE("tied_gate_forward matches DBTrimKV's tied gate formula") {
  cudatest::BlasHandle blas;
  const cublasHandle_t handle = blas.get();
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal;
  for (auto act : {kp::gate::Activation::silu, kp::gate::Activation::gelu})
    for (std::int64_t T : {1, 5, 257}) {
      const int D = 80, J = 16, H = 3;
      std::vector<float> pw(H * J * D), pb(H * J), rw(J), rb{0.7f}, x(T * D);
      for (auto& v : pw) v = normal(rng) * 0.1f;
      for (auto& v : pb) v = normal(rng) * 0.1f;
      for (auto& v : rw) v = normal(rng) * 0.3f;
      for (auto& v : x) v = normal(rng);
      DeviceBuffer<float> dpw(pw), dpb(pb), drw(rw), drb(rb), dx(x), out(std::size_t(H) * T);
      out.poison(0xFF);
      kc::TiedGateWeights w{dpw.get(), dpb.get(), drw.get(), drb.get(), D, J, H, act};
      std::size_t bytes = 0;
      kc::tied_gate_forward(nullptr, bytes, handle, w, dx.get(), T, out.get(), nullptr);
      DeviceBuffer<unsigned char> ws(bytes);
      kc::tied_gate_forward(ws.get(), bytes, handle, w, dx.get(), T, out.get(), nullptr);
      cudatest::sync();
      const auto got = out.download();
      for (std::int64_t t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) {
          double z = rb[0];
          for (int j = 0; j < J; ++j) {
            double p = pb[h * J + j];
            for (int c = 0; c < D; ++c) p += double(pw[(h * J + j) * D + c]) * x[t * D + c];
            z += act_ref(act, p) * rw[j];
          }
          const double want = logsigmoid_ref(z);
          INFO("token ", t, ", head ", h, ", T = ", T);
          CHECK(std::abs(got[h * T + t] - want) <= 1e-5 * std::max(1.0, std::abs(want)));
        }
    }
}

TEST_CASE("write_gate_forward matches WG-KV's write gate formula") {
  cudatest::BlasHandle blas;
  const cublasHandle_t handle = blas.get();
  std::mt19937_64 rng(13);
  std::normal_distribution<float> normal;
  struct Shape {
    int H, d, E;
    std::int64_t T;
  };
  // d below, at and above a warp; E = 4d (SPEC) and 1.5d (the authors' Qwen3 gates); T = 1 (decode)
  for (const Shape& c : {Shape{2, 16, 64, 1}, Shape{4, 64, 96, 7}, Shape{8, 128, 512, 1}, Shape{3, 128, 192, 300},
                         Shape{1, 40, 160, 33}}) {
    const int H = c.H, d = c.d, E = c.E;
    const std::int64_t T = c.T;
    std::vector<float> pre_norm(d), post_norm(d), w1(std::size_t(H) * E * 2 * d), b1(std::size_t(H) * E),
        w2(std::size_t(H) * E), b2(H), k_pre(std::size_t(H) * T * d), k_post(k_pre.size());
    for (auto& v : pre_norm) v = 1.0f + 0.2f * normal(rng);
    for (auto& v : post_norm) v = 1.0f + 0.2f * normal(rng);
    for (auto& v : w1) v = normal(rng) / std::sqrt(2.0f * d);
    for (auto& v : b1) v = 0.1f * normal(rng);
    for (auto& v : w2) v = normal(rng) / std::sqrt(float(E)) * 3.0f;
    for (int h = 0; h < H; ++h) b2[h] = h % 2 == 0 ? -6.0f : 0.5f;  // some gates near the 1e-3 floor
    b2[0] = -30.0f;                                                 // and head 0's certainly on it
    for (auto& v : k_pre) v = normal(rng) * 4.0f;
    for (auto& v : k_post) v = normal(rng) * 4.0f;
    DeviceBuffer<float> dpre_norm(pre_norm), dpost_norm(post_norm), dw1(w1), db1(b1), dw2(w2), db2(b2), dk_pre(k_pre),
        dk_post(k_post), out(std::size_t(H) * T);
    out.poison(0xFF);
    kc::WriteGateWeights w{dpre_norm.get(), dpost_norm.get(), dw1.get(), db1.get(), dw2.get(), db2.get(), H, d, E};
    std::size_t bytes = 0;
    kc::write_gate_forward(nullptr, bytes, handle, w, dk_pre.get(), dk_post.get(), T, out.get(), nullptr);
    DeviceBuffer<unsigned char> ws(bytes);
    kc::write_gate_forward(ws.get(), bytes, handle, w, dk_pre.get(), dk_post.get(), T, out.get(), nullptr);
    cudatest::sync();
    const auto got = out.download();
    int floored = 0;
    for (int h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        std::vector<double> f(2 * d);
        for (int part = 0; part < 2; ++part) {
          const float* x = &(part == 0 ? k_pre : k_post)[(std::size_t(h) * T + t) * d];
          const auto& weight = part == 0 ? pre_norm : post_norm;
          double ss = 0.0;
          for (int i = 0; i < d; ++i) ss += double(x[i]) * x[i];
          const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
          for (int i = 0; i < d; ++i) f[part * d + i] = x[i] * inv * weight[i];
        }
        double z = b2[h];
        for (int e = 0; e < E; ++e) {
          double u = b1[std::size_t(h) * E + e];
          for (int i = 0; i < 2 * d; ++i) u += double(w1[(std::size_t(h) * E + e) * 2 * d + i]) * f[i];
          z += w2[std::size_t(h) * E + e] * act_ref(kp::gate::Activation::gelu, u);
        }
        const double want = std::max(1.0 / (1.0 + std::exp(-z)), 1e-3);
        floored += want == 1e-3;
        INFO("head ", h, ", token ", t, ", Hkv = ", H, ", d = ", d, ", E = ", E, ", T = ", T);
        CHECK(std::abs(got[h * T + t] - want) <= 1e-5);
      }
    CHECK(floored > 0);  // the clamp was exercised
  }
}

TEST_CASE("retention gate arguments are checked before any launch" * doctest::test_suite("host")) {
  kc::RetentionGateWeights w;
  std::size_t bytes = 0;
  CHECK_THROWS_WITH(kc::retention_gate_forward(nullptr, bytes, nullptr, w, nullptr, 1, nullptr, nullptr),
                    doctest::Contains("hidden = 0"));
  w.hidden = 8;
  w.intermediate = 4;
  w.kv_heads = 2;
  CHECK_THROWS_WITH(kc::retention_gate_forward(nullptr, bytes, nullptr, w, nullptr, -3, nullptr, nullptr),
                    doctest::Contains("tokens = -3"));
  kc::retention_gate_forward(nullptr, bytes, nullptr, w, nullptr, 10, nullptr, nullptr);
  CHECK(bytes >= 10 * (4 + 2) * sizeof(float));
  kc::TiedGateWeights tied;
  CHECK_THROWS_WITH(kc::tied_gate_forward(nullptr, bytes, nullptr, tied, nullptr, 1, nullptr, nullptr),
                    doctest::Contains("proj J = 0"));
  tied.hidden = 8;
  tied.proj = 4;
  tied.kv_heads = 2;
  kc::tied_gate_forward(nullptr, bytes, nullptr, tied, nullptr, 10, nullptr, nullptr);
  CHECK(bytes >= 10 * 2 * 4 * sizeof(float));
  kc::WriteGateWeights wg;
  CHECK_THROWS_WITH(kc::write_gate_forward(nullptr, bytes, nullptr, wg, nullptr, nullptr, 1, nullptr, nullptr),
                    doctest::Contains("expansion E = 0"));
  wg.kv_heads = 2;
  wg.head_dim = 64;
  wg.expansion = 256;
  CHECK_THROWS_WITH(kc::write_gate_forward(nullptr, bytes, nullptr, wg, nullptr, nullptr, -1, nullptr, nullptr),
                    doctest::Contains("tokens = -1"));
  kc::write_gate_forward(nullptr, bytes, nullptr, wg, nullptr, nullptr, 10, nullptr, nullptr);
  CHECK(bytes >= 2 * 10 * (2 * 64 + 256) * sizeof(float));
  CHECK_THROWS_WITH(kc::write_gate_forward(reinterpret_cast<void*>(256), bytes, nullptr, wg, nullptr, nullptr, 10,
                                           nullptr, nullptr),
                    doctest::Contains("the handle, weights, k_pre, k_post and g must be set"));
}
