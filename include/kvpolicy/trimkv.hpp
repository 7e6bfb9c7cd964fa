/// \file
/// kvpolicy/trimkv.hpp — TRIM-KV on the CPU: the preset and registry entry of
/// kvpolicy/policies/trimkv.hpp (SPEC §1) with the CPU backend it defaults to. A device program
/// includes kvpolicy/policies/trimkv.hpp and kvpolicy/cuda.cuh instead.
///
///   kvpolicy::TrimKVCache<> cache(shape, kvpolicy::memory::Paged<16>(pages),
///                                 kvpolicy::trimkv_evictor({.budget = 1024, .buffer = 128}));
#pragma once

#include "kvpolicy/cpu.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/memory/contiguous.hpp"
#include "kvpolicy/policies/trimkv.hpp"
