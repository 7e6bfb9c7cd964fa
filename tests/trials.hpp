// How many random trials a test runs. Under AddressSanitizer (the asan preset, docs/developing.md)
// every access is checked and a step costs 5-10x a Release one; that run looks for memory errors and
// undefined behaviour on the code paths, which a quarter of the trials reach as well, while the
// Release suite runs all of them for the oracle comparisons.
#pragma once

#include <algorithm>

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitized = true;
#else
inline constexpr bool kAddressSanitized = false;
#endif
#else
inline constexpr bool kAddressSanitized = false;
#endif

/// `n` trials in a Release build, a quarter of them (at least one) under AddressSanitizer.
constexpr int random_trials(int n) { return kAddressSanitized ? std::max(1, n / 4) : n; }
