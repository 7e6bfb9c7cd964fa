/// \file
/// kvpolicy/cuda/device_parts.hpp — which parts the device Cache (cuda_backend) runs, as host
/// constants: the executor (cuda/executor.cuh) refuses a composition by these, and the registry
/// (kvpolicy/runs_on.hpp) answers from them whether a policy runs on the device, without CUDA.
#pragma once

#include <type_traits>

#include "kvpolicy/cache/scorer_records.hpp"
#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/score/observed_attention.hpp"

namespace kvpolicy::gpu {

/// The device scores a Scorer the way it declares (core/record.hpp, DeviceScoring): entry by entry
/// (its own KVPOLICY_HD operator()), or by the observed attention (SnapKV's, TOVA's, AdaKV's score)
/// from the queries its record keeps, which the device's kernel reads with score::ObservedAttention's
/// settings. A Scorer that declares neither (H2O's mass, KeyDiff, Expected Attention, WG-KV's budget, a
/// user's recording Scorer) runs on the CPU.
template <class S>
inline constexpr bool device_scores =
    device_scoring_of<S>() == DeviceScoring::by_entry ||
    (device_scoring_of<S>() == DeviceScoring::observed_attention && std::is_convertible_v<const S&, const score::ObservedAttention&> &&
     std::is_same_v<typename kvpolicy::detail::RecordOf<S>::type, score::ObservedAttention::Record>);

/// The device cache admits every token.
template <class A>
inline constexpr bool device_admits = std::is_same_v<A, admit::All>;

/// The device runs no Evictor whose budget weighs what the gates admitted (WG-KV's hard budget).
template <class E>
inline constexpr bool device_evicts = !evictor_tells_binding<E>;

/// The device keeps its entries in pages of 16, 32 or 64 of a memory::Paged pool.
template <class Alloc>
inline constexpr bool device_allocates = false;
template <int P, class Storage>
inline constexpr bool device_allocates<memory::Paged<P, Storage>> = P == 16 || P == 32 || P == 64;

/// Whether Cache<S, A, E, memory::Paged<16>, cuda_backend> compiles.
template <class S, class A, class E>
inline constexpr bool device_runs = device_scores<S> && device_admits<A> && device_evicts<E>;

}  // namespace kvpolicy::gpu
