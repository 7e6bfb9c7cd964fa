/// \file
/// kvpolicy/baselines.hpp — SPEC §5's training-free baselines on the CPU: the presets and registry
/// entries of StreamingLLM, H2O, KNorm, KeyDiff, Random, SnapKV, PyramidKV, Expected Attention,
/// TOVA, AdaKV and the full cache (one file each under kvpolicy/policies/) with the CPU backend they
/// default to. They take log_beta like every cache and ignore it: pass zeros. A device program includes
/// the policy's file and kvpolicy/cuda.cuh instead.
///
///   kvpolicy::StreamingLLMCache<> cache(shape, kvpolicy::memory::Paged<16>(pages),
///                                       kvpolicy::baseline_evictor({.budget = 1024}),
///                                       kvpolicy::score::Recency{.sinks = 4});
#pragma once

#include "kvpolicy/cpu.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/policies/adakv.hpp"
#include "kvpolicy/policies/expected_attention.hpp"
#include "kvpolicy/policies/full.hpp"
#include "kvpolicy/policies/h2o.hpp"
#include "kvpolicy/policies/keydiff.hpp"
#include "kvpolicy/policies/knorm.hpp"
#include "kvpolicy/policies/pyramidkv.hpp"
#include "kvpolicy/policies/random.hpp"
#include "kvpolicy/policies/snapkv.hpp"
#include "kvpolicy/policies/streamingllm.hpp"
#include "kvpolicy/policies/tova.hpp"
