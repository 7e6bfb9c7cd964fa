/// \file
/// kvpolicy/core/error.hpp — the one error type of the library (SPEC §7).
/// Every public entry point validates its inputs and throws kvpolicy::Error with a message that
/// names the offending value; a call that throws leaves every object it touched unchanged.
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvpolicy {

/// The one exception the library throws (SPEC §7): its message starts with "kvpolicy: " and names the bad
/// value. It does not wrap std::bad_alloc from the ordinary allocations inside a call (a pool that
/// cannot be allocated is a kvpolicy::Error): catch std::exception at the engine boundary to be safe.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error("kvpolicy: " + what) {}
};

/// Builds the message from streamable parts: fail("budget M = ", m, " must be >= 1").
template <class... Parts>
[[noreturn]] inline void fail(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  throw Error(out.str());
}

/// require(cond, parts...) — throw unless cond holds. Not an assert: it guards user input.
template <class... Parts>
inline void require(bool cond, Parts&&... parts) {
  if (!cond) fail(std::forward<Parts>(parts)...);
}

}  // namespace kvpolicy
