/// \file
/// kvpolicy/cuda/kernels/write_gate.cuh — WG-KV's write gate on the device (SPEC §3), the CUDA twin of
/// gate::WriteGate::forward, for a prefill chunk or a decode token (T = 1), per kv head h:
///   F_h = [ rmsnorm(k_pre) * w_pre ; rmsnorm(k_post) * w_post ]   [T, 2d]  one warp per row
///   U_h = F_h W1[h]^T                                               [T, E]   cuBLAS strided-batched
///                                                                            SGEMM over the heads
///   g[h, t] = max(sigmoid(w2[h] . gelu(U_h[t] + b1[h]) + b2[h]), 1e-3)       one warp per (h, t)
/// fp32 throughout (the rms in double, as the CPU gate); GELU is the KVPOLICY_HD math::gelu the
/// CPU gate calls. g comes out [Hkv, T], the layout Cache::append and gpu::append take it in.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvpolicy/core/math.hpp"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/kernels/gemm.cuh"
#include "kvpolicy/cuda/kernels/retention_gate.cuh"
#include "kvpolicy/cuda/memory/views.cuh"

namespace kvpolicy::gpu {

/// One layer's write-gate weights in device memory, as the checkpoint stores them
/// (model.layers.{l}.self_attn.write_gate.*, docs/formats.md): pre_norm [d], post_norm [d],
/// w1 [Hkv, E, 2d], b1 [Hkv, E], w2 [Hkv, E], b2 [Hkv].
struct WriteGateWeights {
  const float* pre_norm = nullptr;
  const float* post_norm = nullptr;
  const float* w1 = nullptr;
  const float* b1 = nullptr;
  const float* w2 = nullptr;
  const float* b2 = nullptr;
  std::int32_t kv_heads = 0;   // Hkv
  std::int32_t head_dim = 0;   // d
  std::int32_t expansion = 0;  // E
};

namespace detail {

inline constexpr float kWriteGateRmsEpsilon = 1e-6f;  // gate::WriteGateConfig::rms_epsilon
inline constexpr float kWriteGateFloor = 1e-3f;       // gate::WriteGateConfig::floor

/// One warp per (h, t): F[h, t] = [rmsnorm(k_pre[h, t]) * pre_norm ; rmsnorm(k_post[h, t]) * post_norm].
/// The mean square in double, lane-strided then reduced (the CPU sums in index order; both are far
/// inside the gate's tolerance).
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void write_gate_features_kernel(const float* k_pre, const float* k_post, WriteGateWeights w,
                                           std::int64_t rows, float* features) {
  const std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= rows) return;  // the whole warp leaves together
  const int d = w.head_dim;
  for (int part = 0; part < 2; ++part) {
    const float* x = (part == 0 ? k_pre : k_post) + row * d;
    const float* weight = part == 0 ? w.pre_norm : w.post_norm;
    double ss = 0.0;
    for (int i = lane; i < d; i += 32) ss += static_cast<double>(x[i]) * x[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = static_cast<float>(1.0 / sqrt(ss / d + kWriteGateRmsEpsilon));
    float* out = features + row * 2 * d + part * d;
    for (int i = lane; i < d; i += 32) out[i] = __fmul_rn(__fmul_rn(x[i], inv), weight[i]);
  }
}

/// One warp per (h, t): z = w2[h] . gelu(U[h, t] + b1[h]) + b2[h]; g = max(sigmoid(z), 1e-3).
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void write_gate_readout_kernel(const float* u, WriteGateWeights w, std::int64_t tokens, float* g) {
  const std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= std::int64_t{w.kv_heads} * tokens) return;
  const std::int64_t h = row / tokens;
  const int E = w.expansion;
  float z = 0.0f;
  for (int e = lane; e < E; e += 32)
    z = __fadd_rn(z, __fmul_rn(math::gelu(__fadd_rn(u[row * E + e], w.b1[h * E + e])), w.w2[h * E + e]));
  for (int o = 16; o > 0; o >>= 1) z = __fadd_rn(z, __shfl_xor_sync(0xffffffffu, z, o));
  if (lane == 0) g[row] = fmaxf(1.0f / (1.0f + expf(-__fadd_rn(z, w.b2[h]))), kWriteGateFloor);
}

}  // namespace detail

inline void validate_write_gate(const WriteGateWeights& w, std::int64_t tokens, const char* who) {
  require(w.kv_heads >= 1 && w.head_dim >= 1 && w.expansion >= 1, who, ": kv_heads = ", w.kv_heads, ", head_dim = ",
          w.head_dim, ", expansion E = ", w.expansion, " must all be >= 1");
  require(w.head_dim <= INT32_MAX / 2, who, ": head_dim = ", w.head_dim, " makes 2d exceed a GEMM dimension");
  require(tokens >= 0 && tokens <= INT32_MAX, who, ": tokens = ", tokens, " must be in [0, 2^31 - 1]");
  require(std::int64_t{w.kv_heads} * tokens <= INT32_MAX / 32, who, ": Hkv x tokens = ", std::int64_t{w.kv_heads} * tokens,
          " rows exceed one launch");
}

inline std::size_t write_gate_workspace_bytes(const WriteGateWeights& w, std::int64_t tokens) {
  validate_write_gate(w, tokens, "gpu::write_gate_workspace_bytes");
  WorkspaceLayout layout;
  layout.take<float>(nullptr, std::int64_t{w.kv_heads} * tokens * 2 * w.head_dim);  // F
  layout.take<float>(nullptr, std::int64_t{w.kv_heads} * tokens * w.expansion);     // U
  return layout.bytes();
}

/// k_pre, k_post [Hkv, tokens, d] fp32 (the keys before and after RoPE) -> g [Hkv, tokens] fp32 in
/// [1e-3, 1], on `stream` (set on the handle for these calls). Two-phase: workspace == nullptr sets
/// workspace_bytes and returns. Non-finite keys are the caller's to refuse (the CPU gate does).
/// Throws for a size below 1, tokens outside [0, 2^31 - 1], a null pointer, or a cuBLAS failure.
inline void write_gate_forward(void* workspace, std::size_t& workspace_bytes, cublasHandle_t handle,
                               const WriteGateWeights& w, const float* k_pre, const float* k_post, std::int64_t tokens,
                               float* g, cudaStream_t stream) {
  constexpr const char* who = "gpu::write_gate_forward";
  validate_write_gate(w, tokens, who);
  if (size_query(workspace, workspace_bytes, write_gate_workspace_bytes(w, tokens), who)) return;
  if (tokens == 0) return;
  require((handle || !gemm_uses_cublas) && w.pre_norm && w.post_norm && w.w1 && w.b1 && w.w2 && w.b2 && k_pre && k_post && g, who,
          ": the handle, weights, k_pre, k_post and g must be set");
  const std::int64_t rows = std::int64_t{w.kv_heads} * tokens;
  WorkspaceLayout layout;
  float* features = layout.take<float>(workspace, rows * 2 * w.head_dim);
  float* u = layout.take<float>(workspace, rows * w.expansion);
  const std::string shapes = "tokens = " + std::to_string(tokens) + ", Hkv = " + std::to_string(w.kv_heads) +
                             ", d = " + std::to_string(w.head_dim) + ", E = " + std::to_string(w.expansion);
  constexpr int kThreads = 256;  // 8 warps, a row each
  detail::write_gate_features_kernel<><<<blocks_for(rows * 32, kThreads, "write_gate_features_kernel"), kThreads, 0,
                                         stream>>>(k_pre, k_post, w, rows, features);
  check_launch("write_gate_features_kernel", shapes);
  const int T = static_cast<int>(tokens), K = 2 * w.head_dim, E = w.expansion;
  // per head h, row-major U_h[T, E] = F_h[T, 2d] W1_h[E, 2d]^T, batched over the heads
  detail::gemm_nt(handle, T, E, K, features, static_cast<long long>(T) * K, w.w1, static_cast<long long>(E) * K, u,
                  static_cast<long long>(T) * E, w.kv_heads, stream, "cublasSgemmStridedBatched (F W1^T per head)",
                  shapes);
  detail::write_gate_readout_kernel<><<<blocks_for(rows * 32, kThreads, "write_gate_readout_kernel"), kThreads, 0,
                                        stream>>>(u, w, tokens, g);
  check_launch("write_gate_readout_kernel", shapes);
}

}  // namespace kvpolicy::gpu
