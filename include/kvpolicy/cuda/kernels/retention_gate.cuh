/// \file
/// kvpolicy/cuda/kernels/retention_gate.cuh — the retention gates on the device, CUDA twins of
/// gate::RetentionGate::forward (TRIM-KV, SPEC §1) and gate::TiedGate::forward (DBTrimKV's
/// weight-tied gate, SPEC §2), for a prefill chunk or a decode token (T = 1). TRIM-KV:
///   U = act(X W1^T + b1)   [T, I]   cuBLAS SGEMM (cuda/kernels/gemm.cuh), then a fused bias + activation kernel
///   Z = U W2^T             [T, Hkv] cuBLAS SGEMM
///   log_beta[h, t] = logsigmoid(Z[t, h] + b[h])   [Hkv, T]  (the layout append takes)
/// DBTrimKV, the authors' rg10 (SPEC §2; gate::Rg10Gate), the TRIM-KV pipeline with a second layer:
///   U1 = act(X W1^T + b1), U2 = act(U1 W2^T + b2)   [T, I]    two SGEMMs, each with the fused bias + activation
///   log_beta[h, t] = logsigmoid((U2 W3^T)[t, h] + b[h])    SGEMM, then the fused bias + logsigmoid
/// DBTrimKV, the paper's literal tied gate:
///   P = X Wp^T             [T, Hkv J] cuBLAS SGEMM
///   log_beta[h, t] = logsigmoid(sum_j act(P[t, h J + j] + bp[h J + j]) wg[j] + bg)   one fused kernel
/// fp32 throughout (no TF32: the handle's math mode is left to the engine, whose default is exact
/// fp32; a handle set to TF32 trades the gates' 1e-5 agreement with the CPU for speed). Each call
/// sets the handle's stream and its pointer mode to host (alpha and beta are host scalars). The
/// activation and logsigmoid are the KVPOLICY_HD functions the CPU gate calls. Each forward throws
/// for a size below 1, tokens outside [0, 2^31 - 1], a null pointer, or a cuBLAS failure; unlike the
/// CPU gates it does not check its inputs for non-finite values.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/kernels/gemm.cuh"
#include "kvpolicy/cuda/memory/views.cuh"
#include "kvpolicy/gate/activation.hpp"

namespace kvpolicy::gpu {

/// One layer's gate weights in device memory, row-major as the checkpoint stores them
/// (model.layers.{l}.self_attn.retention_gate.*, SPEC §1): w1 [I, D], b1 [I], w2 [Hkv, I], b [Hkv].
struct RetentionGateWeights {
  const float* w1 = nullptr;
  const float* b1 = nullptr;
  const float* w2 = nullptr;
  const float* b = nullptr;
  std::int32_t hidden = 0;        // D
  std::int32_t intermediate = 0;  // I
  std::int32_t kv_heads = 0;      // Hkv
  gate::Activation activation = gate::Activation::silu;
};

namespace detail {

template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void bias_activation_kernel(float* u, const float* b1, std::int64_t tokens, std::int32_t intermediate,
                                       gate::Activation act) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * intermediate) return;
  u[i] = gate::activate(act, u[i] + b1[i % intermediate]);
}

template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void bias_logsigmoid_kernel(const float* z, const float* b, std::int64_t tokens, std::int32_t kv_heads,
                                       float* log_beta) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * kv_heads) return;
  const std::int64_t t = i / kv_heads, h = i % kv_heads;
  log_beta[h * tokens + t] = math::logsigmoid(z[i] + b[h]);
}

/// One dense layer of a gate: out [T, N] = act(in [T, K] W^T + b), W [N, K] row-major (an SGEMM,
/// then the fused bias + activation).
inline void dense_activated(cublasHandle_t handle, int tokens, int n, int k, const float* in, const float* w,
                            const float* b, float* out, gate::Activation act, cudaStream_t stream, const char* what,
                            const std::string& shapes) {
  gemm_nt(handle, tokens, n, k, in, 0, w, 0, out, 0, 1, stream, what, shapes);
  const std::int64_t count = std::int64_t{tokens} * n;
  bias_activation_kernel<><<<blocks_for(count, 256, "bias_activation_kernel"), 256, 0, stream>>>(out, b, tokens, n, act);
  check_launch("bias_activation_kernel", what, ", ", shapes);
}

/// A gate's readout: log_beta [Hkv, T] = logsigmoid(in [T, K] W^T + b)^T, W [Hkv, K] (an SGEMM into
/// z [T, Hkv], then the fused bias + logsigmoid).
inline void readout_logsigmoid(cublasHandle_t handle, int tokens, int kv_heads, int k, const float* in, const float* w,
                               const float* b, float* z, float* log_beta, cudaStream_t stream, const char* what,
                               const std::string& shapes) {
  gemm_nt(handle, tokens, kv_heads, k, in, 0, w, 0, z, 0, 1, stream, what, shapes);
  const std::int64_t count = std::int64_t{tokens} * kv_heads;
  bias_logsigmoid_kernel<><<<blocks_for(count, 256, "bias_logsigmoid_kernel"), 256, 0, stream>>>(z, b, tokens, kv_heads,
                                                                                               log_beta);
  check_launch("bias_logsigmoid_kernel", shapes);
}

}  // namespace detail

inline std::size_t retention_gate_workspace_bytes(const RetentionGateWeights& w, std::int64_t tokens) {
  WorkspaceLayout layout;
  layout.take<float>(nullptr, tokens * w.intermediate);
  layout.take<float>(nullptr, tokens * w.kv_heads);
  return layout.bytes();
}

/// x [tokens, D] fp32 (the attention block's normalised input) -> log_beta [Hkv, tokens] fp32, on
/// `stream` (set on the handle for these calls). Two-phase: workspace == nullptr sets
/// workspace_bytes and returns.
inline void retention_gate_forward(void* workspace, std::size_t& workspace_bytes, cublasHandle_t handle,
                                   const RetentionGateWeights& w, const float* x, std::int64_t tokens,
                                   float* log_beta, cudaStream_t stream) {
  constexpr const char* who = "gpu::retention_gate_forward";
  require(w.hidden >= 1 && w.intermediate >= 1 && w.kv_heads >= 1, who, ": hidden = ", w.hidden,
          ", intermediate = ", w.intermediate, ", kv_heads = ", w.kv_heads, " must all be >= 1");
  require(tokens >= 0 && tokens <= INT32_MAX, who, ": tokens = ", tokens, " must be in [0, 2^31 - 1]");
  if (size_query(workspace, workspace_bytes, retention_gate_workspace_bytes(w, tokens), who)) return;
  if (tokens == 0) return;
  require((handle || !gemm_uses_cublas) && w.w1 && w.b1 && w.w2 && w.b && x && log_beta, who,
          ": the handle, weights, x and log_beta must be set");
  WorkspaceLayout layout;
  float* u = layout.take<float>(workspace, tokens * w.intermediate);
  float* z = layout.take<float>(workspace, tokens * w.kv_heads);
  const std::string shapes = "tokens = " + std::to_string(tokens) + ", D = " + std::to_string(w.hidden) +
                             ", I = " + std::to_string(w.intermediate) + ", Hkv = " + std::to_string(w.kv_heads);
  const int T = static_cast<int>(tokens);
  detail::dense_activated(handle, T, w.intermediate, w.hidden, x, w.w1, w.b1, u, w.activation, stream,
                          "cublasSgemm (X W1^T)", shapes);
  detail::readout_logsigmoid(handle, T, w.kv_heads, w.intermediate, u, w.w2, w.b, z, log_beta, stream,
                             "cublasSgemm (U W2^T)", shapes);
}

/// One layer of DBTrimKV's rg10 gate in device memory, row-major as the checkpoint stores it (SPEC
/// §2): w1 [I, D], b1 [I], w2 [I, I], b2 [I]; w3 [Hkv, I] and b [Hkv], the readout every layer shares
/// (load it once: gate::Rg10Gate::load checks the copies are identical).
struct Rg10GateWeights {
  const float* w1 = nullptr;
  const float* b1 = nullptr;
  const float* w2 = nullptr;
  const float* b2 = nullptr;
  const float* w3 = nullptr;
  const float* b = nullptr;
  std::int32_t hidden = 0;        // D
  std::int32_t intermediate = 0;  // I
  std::int32_t kv_heads = 0;      // Hkv
  gate::Activation activation = gate::Activation::silu;
};

inline std::size_t rg10_gate_workspace_bytes(const Rg10GateWeights& w, std::int64_t tokens) {
  WorkspaceLayout layout;
  layout.take<float>(nullptr, tokens * w.intermediate);
  layout.take<float>(nullptr, tokens * w.intermediate);
  layout.take<float>(nullptr, tokens * w.kv_heads);
  return layout.bytes();
}

/// x [tokens, D] fp32 (the attention block's normalised input) -> log_beta [Hkv, tokens] fp32 by
/// the rg10 gate, on `stream`. Two-phase: workspace == nullptr sets workspace_bytes and returns.
inline void rg10_gate_forward(void* workspace, std::size_t& workspace_bytes, cublasHandle_t handle,
                              const Rg10GateWeights& w, const float* x, std::int64_t tokens, float* log_beta,
                              cudaStream_t stream) {
  constexpr const char* who = "gpu::rg10_gate_forward";
  require(w.hidden >= 1 && w.intermediate >= 1 && w.kv_heads >= 1, who, ": hidden = ", w.hidden,
          ", intermediate = ", w.intermediate, ", kv_heads = ", w.kv_heads, " must all be >= 1");
  require(tokens >= 0 && tokens <= INT32_MAX, who, ": tokens = ", tokens, " must be in [0, 2^31 - 1]");
  if (size_query(workspace, workspace_bytes, rg10_gate_workspace_bytes(w, tokens), who)) return;
  if (tokens == 0) return;
  require((handle || !gemm_uses_cublas) && w.w1 && w.b1 && w.w2 && w.b2 && w.w3 && w.b && x && log_beta, who,
          ": the handle, weights, x and log_beta must be set");
  WorkspaceLayout layout;
  float* u1 = layout.take<float>(workspace, tokens * w.intermediate);
  float* u2 = layout.take<float>(workspace, tokens * w.intermediate);
  float* z = layout.take<float>(workspace, tokens * w.kv_heads);
  const std::string shapes = "tokens = " + std::to_string(tokens) + ", D = " + std::to_string(w.hidden) +
                             ", I = " + std::to_string(w.intermediate) + ", Hkv = " + std::to_string(w.kv_heads);
  const int T = static_cast<int>(tokens);
  detail::dense_activated(handle, T, w.intermediate, w.hidden, x, w.w1, w.b1, u1, w.activation, stream,
                          "cublasSgemm (X W1^T)", shapes);
  detail::dense_activated(handle, T, w.intermediate, w.intermediate, u1, w.w2, w.b2, u2, w.activation, stream,
                          "cublasSgemm (U1 W2^T)", shapes);
  detail::readout_logsigmoid(handle, T, w.kv_heads, w.intermediate, u2, w.w3, w.b, z, log_beta, stream,
                             "cublasSgemm (U2 W3^T)", shapes);
}

/// DBTrimKV's tied gate in device memory (SPEC §2): per layer proj.weight [Hkv J, D] and
/// proj.bias [Hkv J]; for the whole model readout.weight [J] and readout.bias [1].
struct TiedGateWeights {
  const float* proj_w = nullptr;
  const float* proj_b = nullptr;
  const float* readout_w = nullptr;
  const float* readout_b = nullptr;
  std::int32_t hidden = 0;    // D
  std::int32_t proj = 0;      // J
  std::int32_t kv_heads = 0;  // Hkv
  gate::Activation activation = gate::Activation::silu;
};

namespace detail {

/// One thread per (token, kv head): the head's J projections, activated, read out.
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void tied_readout_kernel(const float* p, TiedGateWeights w, std::int64_t tokens, float* log_beta) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * w.kv_heads) return;
  const std::int64_t t = i / w.kv_heads, h = i % w.kv_heads;
  const std::int64_t hj = std::int64_t{w.kv_heads} * w.proj;
  float z = 0.0f;
  for (int j = 0; j < w.proj; ++j) {
    const std::int64_t c = h * w.proj + j;
    z = __fadd_rn(z, __fmul_rn(gate::activate(w.activation, __fadd_rn(p[t * hj + c], w.proj_b[c])), w.readout_w[j]));
  }
  log_beta[h * tokens + t] = math::logsigmoid(__fadd_rn(z, *w.readout_b));
}

}  // namespace detail

inline std::size_t tied_gate_workspace_bytes(const TiedGateWeights& w, std::int64_t tokens) {
  WorkspaceLayout layout;
  layout.take<float>(nullptr, tokens * w.kv_heads * w.proj);
  return layout.bytes();
}

/// x [tokens, D] fp32 -> log_beta [Hkv, tokens] fp32 by DBTrimKV's tied gate, on `stream`.
/// Two-phase: workspace == nullptr sets workspace_bytes and returns.
inline void tied_gate_forward(void* workspace, std::size_t& workspace_bytes, cublasHandle_t handle,
                              const TiedGateWeights& w, const float* x, std::int64_t tokens, float* log_beta,
                              cudaStream_t stream) {
  constexpr const char* who = "gpu::tied_gate_forward";
  require(w.hidden >= 1 && w.proj >= 1 && w.kv_heads >= 1, who, ": hidden = ", w.hidden, ", proj J = ", w.proj,
          ", kv_heads = ", w.kv_heads, " must all be >= 1");
  require(tokens >= 0 && tokens <= INT32_MAX, who, ": tokens = ", tokens, " must be in [0, 2^31 - 1]");
  require(std::int64_t{w.kv_heads} * w.proj <= INT32_MAX, who, ": Hkv x J = ", std::int64_t{w.kv_heads} * w.proj,
          " exceeds a GEMM dimension");
  if (size_query(workspace, workspace_bytes, tied_gate_workspace_bytes(w, tokens), who)) return;
  if (tokens == 0) return;
  require((handle || !gemm_uses_cublas) && w.proj_w && w.proj_b && w.readout_w && w.readout_b && x && log_beta, who,
          ": the handle, weights, x and log_beta must be set");
  WorkspaceLayout layout;
  float* p = layout.take<float>(workspace, tokens * w.kv_heads * w.proj);
  const int hj = w.kv_heads * w.proj;
  const std::string shapes = "tokens = " + std::to_string(tokens) + ", D = " + std::to_string(w.hidden) +
                             ", J = " + std::to_string(w.proj) + ", Hkv = " + std::to_string(w.kv_heads);
  // row-major P[T, Hkv J] = X[T, D] Wp[Hkv J, D]^T
  detail::gemm_nt(handle, static_cast<int>(tokens), hj, w.hidden, x, 0, w.proj_w, 0, p, 0, 1, stream,
                  "cublasSgemm (X Wp^T)", shapes);
  const std::int64_t n = tokens * w.kv_heads;
  detail::tied_readout_kernel<><<<blocks_for(n, 256, "tied_readout_kernel"), 256, 0, stream>>>(p, w, tokens, log_beta);
  check_launch("tied_readout_kernel", shapes);
}

}  // namespace kvpolicy::gpu
