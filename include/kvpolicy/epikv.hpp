/// \file
/// kvpolicy/epikv.hpp — SPEC §4's policies on the CPU: the EpiKV preset
/// (kvpolicy/policies/common/generated_budget.hpp), the registry entries of EpiKV, HS-var, kv-key,
/// kv-val and lag-kv (kvpolicy/policies/hidden_states.hpp, kv_statistics.hpp) and the signals that
/// score them (epiphany::Signal, kvstats::Tracker), with the CPU backend the preset defaults to.
#pragma once

#include "kvpolicy/cpu.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/policies/hidden_states.hpp"
#include "kvpolicy/policies/kv_statistics.hpp"
