// The retention gate on the device (cuBLAS + fused epilogues) against the CPU gate's formula
// (SPEC §1: log_beta = logsigmoid(W2 act(W1 x + b1) + b)), evaluated in double on the host, for a
// prefill chunk and a decode token, SiLU and GELU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "device_buffer.hpp"
#include "kvpolicy/cuda/retention_gate.cuh"

namespace kp = kvpolicy;
namespace kc = kvpolicy::cuda;
using cudatest::DeviceBuffer;

namespace {

double act_ref(kp::gate::Activation a, double x) {
  return a == kp::gate::Activation::silu ? x / (1.0 + std::exp(-x)) : 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double logsigmoid_ref(double z) { return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z)); }

}  // namespace

TEST_CASE("retention_gate_forward matches the gate's formula") {
  cublasHandle_t handle = nullptr;
  kc::check_cublas(cublasCreate(&handle), "cublasCreate", "test");
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
  cublasDestroy(handle);
}

TEST_CASE("tied_gate_forward matches DBTrimKV's tied gate formula") {
  cublasHandle_t handle = nullptr;
  kc::check_cublas(cublasCreate(&handle), "cublasCreate", "test");
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
  cublasDestroy(handle);
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
}
