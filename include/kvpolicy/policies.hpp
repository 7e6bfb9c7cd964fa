/// \file
/// kvpolicy/policies.hpp — every registered policy on the CPU: the CPU backend and each file under
/// kvpolicy/policies/ (the registry's list, which CMake writes from that folder), so a policy added
/// as its one file is here without an edit. A program that uses one family may include its header
/// instead (kvpolicy/trimkv.hpp, dbtrimkv.hpp, wgkv.hpp, epikv.hpp, baselines.hpp).
///
///   kvpolicy::TOVACache<> cache(shape, kvpolicy::memory::Paged<16>(pages), kvpolicy::baseline_evictor({.budget = 256}),
///                               kvpolicy::policies::tova::scorer);
#pragma once

#include "kvpolicy/cpu.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/registry.hpp"  // every file under kvpolicy/policies/ (registered.inc)
