/// \file
/// kvpolicy/wgkv.hpp — WG-KV on the CPU: the presets and registry entry of
/// kvpolicy/policies/wgkv.hpp (SPEC §3) with the CPU backend they default to. A device program
/// includes kvpolicy/policies/wgkv.hpp and kvpolicy/cuda.cuh instead.
#pragma once

#include "kvpolicy/cpu.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/policies/wgkv.hpp"
