// A policy's fields (registry/fields.hpp): its options are its fields' options, in order, then the
// ones no Config member holds; read() sets each field's member from its option's value and leaves
// every other field at its default; with nothing given, each member reads as its option's default
// (the Config's own, or the one the policy's table states).
#include <doctest/doctest.h>

#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>

#include "kvpolicy/policies.hpp"  // every registered policy, with the CPU backend

using namespace kvpolicy;

namespace {

template <class T>
double as_number(T x) {
  if constexpr (std::is_enum_v<T>) return static_cast<double>(static_cast<std::underlying_type_t<T>>(x));
  else return static_cast<double>(x);
}

// A value for option `o` other than its default, as the command line would give it.
std::string other_value(const registry::Option& o) {
  switch (o.kind) {
    case registry::Kind::choice: {
      std::size_t n = 0;
      while (n < o.choices.size() && !o.choices[n].empty()) ++n;
      return std::string(o.choices[(static_cast<std::size_t>(o.fallback) + 1) % n]);
    }
    case registry::Kind::integer: return std::to_string(static_cast<std::int64_t>(o.fallback) + 3);
    case registry::Kind::real: return std::to_string(o.fallback + 0.25);
    case registry::Kind::path: break;
  }
  return "";
}

double number_of(const registry::Option& o, const std::string& text) {
  if (o.kind != registry::Kind::choice) return std::stod(text);
  for (std::size_t i = 0; i < o.choices.size(); ++i)
    if (o.choices[i] == text) return static_cast<double>(i);
  return -1;
}

template <class R>
void check_fields() {
  constexpr auto& fields = R::fields;
  constexpr std::size_t n = std::tuple_size_v<std::remove_cvref_t<decltype(fields)>>;
  REQUIRE(R::options.size() >= n);
  using Config = typename std::tuple_element_t<0, std::remove_cvref_t<decltype(fields)>>::config_type;
  const Config defaults = registry::read<Config>(registry::Values(R::name, R::options, {}), fields);
  std::size_t i = 0;
  std::apply(
      [&](const auto&... f) {
        const auto check = [&](const auto& field) {
          CAPTURE(R::name);
          CAPTURE(field.option.name);
          CHECK(R::options[i].name == field.option.name);  // the options are the fields', in order
          CHECK(as_number(defaults.*field.member) == doctest::Approx(field.option.fallback));
          const std::string text = other_value(field.option);
          const Config c = registry::read<Config>(
              registry::Values(R::name, R::options, {{std::string(field.option.name), text}}), fields);
          CHECK(as_number(c.*field.member) == doctest::Approx(number_of(field.option, text)));
          // every other field as with nothing given
          const bool others_kept = std::apply([&](const auto&... g) {
            return ((g.option.name == field.option.name || as_number(c.*g.member) == as_number(defaults.*g.member)) && ...);
          }, fields);
          CHECK_MESSAGE(others_kept, "--", field.option.name, " changed another field's member");
          ++i;
        };
        (check(f), ...);
      },
      fields);
}

}  // namespace

TEST_CASE("registry fields: each option sets its Config member, the rest keep their defaults, options in the fields' order") {
  int with_fields = 0;
  registry::for_each([&]<registry::Policy R>() {
    if constexpr (requires { R::fields; }) {
      check_fields<R>();
      ++with_fields;
    } else {
      // a policy without fields takes no option a Config member holds (the full cache)
      CHECK_MESSAGE(R::options.empty(), R::name, " has options but no fields");
    }
  });
  CHECK(with_fields >= 18);
}

TEST_CASE("registry fields: an integer the member cannot hold is an error naming the option") {
  using P = policies::snapkv;  // pool-kernel is an int member
  const registry::Values v(P::name, P::options, {{"pool-kernel", "4294967301"}});
  CHECK_THROWS_WITH_AS(registry::read<SnapKVConfig>(v, P::fields), doctest::Contains("--pool-kernel = 4294967301 is out of range"),
                       Error);
  using D = policies::dbtrimkv;  // horizon is an int member
  CHECK_THROWS_WITH_AS(registry::read<DBTrimKVConfig>(registry::Values(D::name, D::options, {{"horizon", "-4294967295"}}), D::fields),
                       doctest::Contains("--horizon = -4294967295 is out of range"), Error);
}
