// Command-line values of the example tools (kvpolicy-replay, kvpolicy-lm): a flag's value is a
// number only if all of it parses, and an integer only if that number is whole; anything else is an
// error that names the flag and the value.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include <kvpolicy/core/error.hpp>

namespace kvpolicy::cli {

inline double number(const std::string& flag, const std::string& v) {
  try {
    std::size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  fail(flag, ": '", v, "' is not a number");
}

inline std::int64_t integer(const std::string& flag, const std::string& v) {
  const double x = number(flag, v);
  require(x == static_cast<double>(static_cast<std::int64_t>(x)), flag, ": '", v, "' is not an integer");
  return static_cast<std::int64_t>(x);
}

}  // namespace kvpolicy::cli
