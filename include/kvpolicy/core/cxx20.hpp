/// \file
/// kvpolicy/core/cxx20.hpp — the library is C++20 (concepts, std::span): a translation unit built
/// with an older standard gets this one line first, before the errors the C++20 code would give.
/// Every public header includes it before anything else.
#pragma once

#if __cplusplus < 202002L
#error "kvpolicy needs C++20: compile with -std=c++20 (CMake: target_compile_features(... cxx_std_20), which kvpolicy::kvpolicy sets)"
#endif
