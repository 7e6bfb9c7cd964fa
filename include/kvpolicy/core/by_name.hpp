/// \file
/// kvpolicy/core/by_name.hpp — the first member of every preset's config (kvpolicy/policies/*.hpp):
/// it takes no value, so a config is written with designated initialisers only
/// (`TrimKVConfig{.budget = 64, .sinks = 4}`) and never by position, where swapping two fields of
/// one type (a window and a sink count) would compile and mean something else.
#pragma once

namespace kvpolicy {

/// Not an aggregate and not convertible from anything: `Config{64, 8}` fails to compile, naming it
/// ("could not convert 64 from int to ByName"). A config declares it first, as
/// `[[no_unique_address]] ByName by_name{};` (no storage; the initialiser keeps -Wextra quiet).
struct ByName {
  constexpr ByName() noexcept {}
};

}  // namespace kvpolicy
