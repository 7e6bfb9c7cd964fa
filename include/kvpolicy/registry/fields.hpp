/// \file
/// kvpolicy/registry/fields.hpp — a policy's options bound to the members of its Config: each
/// registry::Field names the member an option sets, and its default is the Config's own default
/// member value unless the policy's table states another. One table per policy
/// (`static constexpr std::tuple fields{...}`) is then where its options come from (options_of:
/// the registry's options, --help, the Python keyword arguments) and where its Config is read from
/// (read: the parsing), so a field's name, default, range and help are stated once.
///
///   static constexpr std::tuple fields{registry::field::budget<TrimKVConfig>, registry::field::buffer<TrimKVConfig>};
///   static constexpr auto options = registry::options_of(fields, registry::option::gate);
///   ... const TrimKVConfig c = registry::read<TrimKVConfig>(v, fields);
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kvpolicy/registry/policy.hpp"

namespace kvpolicy::registry {

namespace detail {
template <class T>
constexpr bool field_fits(Kind kind) {
  if constexpr (std::is_same_v<T, bool> || std::is_enum_v<T>) return kind == Kind::choice;
  else if constexpr (std::is_integral_v<T>) return kind == Kind::integer;
  else if constexpr (std::is_floating_point_v<T>) return kind == Kind::real;
  else return false;
}
}  // namespace detail

/// Option `option` sets `Config::*member`. An integer or real option sets an arithmetic member; a
/// choice sets an enum or bool member whose values are the choices' indexes (false, true: "off",
/// "on").
template <class Config, class T>
struct Field {
  using config_type = Config;
  using value_type = T;

  Option option;
  T Config::*member;

  /// This policy's default, where it differs from the Config's.
  constexpr Field with_default(double value) const { return {option.with_default(value), member}; }
  constexpr Field with_help(std::string_view text) const { return {option.with_help(text), member}; }
};

/// `o` bound to `member`, its default Config{}.*member. A kind that does not fit the member's type
/// is refused where the policy's table is compiled.
template <class Config, class T>
constexpr Field<Config, T> bind(T Config::*member, Option o) {
  if (!detail::field_fits<T>(o.kind)) throw Error("registry::bind: the option's kind does not fit its member's type");
  const T fallback = Config{}.*member;
  if constexpr (std::is_enum_v<T>) {
    o.fallback = static_cast<double>(static_cast<std::underlying_type_t<T>>(fallback));
  } else {
    o.fallback = static_cast<double>(fallback);
  }
  return {o, member};
}

/// The options of a policy's fields, then `more` (options no Config member holds: the gate's file,
/// the mode, a model's RoPE), in that order.
template <class... F, class... O>
constexpr std::array<Option, sizeof...(F) + sizeof...(O)> options_of(const std::tuple<F...>& fields, O... more) {
  return std::apply([&](const auto&... f) { return std::array<Option, sizeof...(F) + sizeof...(O)>{f.option..., more...}; },
                    fields);
}

namespace detail {
/// Sets `field`'s member of `c` from its option's value; an integer the member cannot hold is an
/// error that names the option.
template <class Config, class T>
void set_field(Config& c, const Values& v, const Field<Config, T>& field) {
  static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>, "a Field's member is a number, a bool or an enum");
  const std::string_view name = field.option.name;
  if constexpr (std::is_same_v<T, bool>) {
    c.*field.member = v.choice(name) != 0;
  } else if constexpr (std::is_enum_v<T>) {
    c.*field.member = static_cast<T>(v.choice(name));
  } else if constexpr (std::is_integral_v<T>) {
    const std::int64_t x = v.integer(name);
    require(std::in_range<T>(x), "--", name, " = ", x, " is out of range");
    c.*field.member = static_cast<T>(x);
  } else {
    c.*field.member = static_cast<T>(v.real(name));
  }
}
}  // namespace detail

/// The Config the values set: every field's member from its option's value (the given one or its
/// default), the other members at the Config's defaults.
template <class Config, class... T>
Config read(const Values& v, const std::tuple<Field<Config, T>...>& fields) {
  Config c{};
  std::apply([&](const auto&... f) { (detail::set_field(c, v, f), ...); }, fields);
  return c;
}

/// The fields most policies share (SPEC §1 budget and buffer, §5 sinks and window, the threshold
/// variant's alpha and floor), bound to the Config's members of those names.
namespace field {
template <class C>
inline constexpr auto budget = bind(&C::budget, option::budget);
template <class C>
inline constexpr auto buffer = bind(&C::buffer, option::buffer);
template <class C>
inline constexpr auto sinks = bind(&C::sinks, option::sinks);
template <class C>
inline constexpr auto window = bind(&C::window, option::window);
template <class C>
inline constexpr auto threshold = bind(&C::threshold, option::threshold);
template <class C>
inline constexpr auto min_tokens = bind(&C::min_tokens, option::min_tokens);
}  // namespace field

}  // namespace kvpolicy::registry
