/// \file
/// kvpolicy/dbtrimkv.hpp — DBTrimKV on the CPU: the preset and registry entry of
/// kvpolicy/policies/dbtrimkv.hpp (SPEC §2) with the CPU backend it defaults to. A device program
/// includes kvpolicy/policies/dbtrimkv.hpp and kvpolicy/cuda.cuh instead.
#pragma once

#include "kvpolicy/cpu.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/policies/dbtrimkv.hpp"
