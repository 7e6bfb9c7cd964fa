// Command-line values of the example tools (kvpolicy-replay, kvpolicy-lm): a flag's value is a
// number only if all of it parses, and an integer only if that number is whole; anything else is an
// error that names the flag and the value.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <kvpolicy/core/error.hpp>
#include <kvpolicy/registry.hpp>

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

/// --list-policies: one registered policy per line, for scripts (tools/quality_table.sh):
/// name, its options (comma-separated, "-" for none), what its entries need from the forward pass
/// (registry::Inputs), and "prompt" when it compresses a prompt the engine declares, else "-";
/// tab-separated.
inline std::string policy_list() {
  std::string out;
  registry::for_each([&]<registry::Policy P>() {
    out += P::name;
    out += '\t';
    const std::size_t before = out.size();
    for (const registry::Option& o : P::options) {
      if (out.size() > before) out += ',';
      out += o.name;
    }
    if (out.size() == before) out += '-';
    out += '\t';
    out += registry::name_of(P::inputs);
    out += requires { P::needs_prompt_length; } ? "\tprompt\n" : "\t-\n";
  });
  return out;
}

/// The policies and their options, from the registry (kvpolicy/registry.hpp), for a tool's --help:
/// each option once, with its first taker's help and default, and where another policy states it
/// differently, that policy's.
inline std::string policy_help() {
  const auto column = [](std::string& out, std::string_view first, std::string_view second) {
    out += "  ";
    out += first;
    out.append(first.size() < 14 ? 14 - first.size() : 1, ' ');
    out += second;
    out += '\n';
  };
  std::string out = "policies:\n";
  registry::for_each([&]<registry::Policy P>() { column(out, P::name, P::help); });
  out += "\npolicy options (a policy refuses an option it does not take):\n";
  for (const registry::Option& first : registry::all_options()) {
    column(out, "--" + std::string(first.name), first.help);
    std::string takers;
    std::string variants;
    registry::for_each([&]<registry::Policy P>() {
      for (const registry::Option& o : P::options) {
        if (o.name != first.name) continue;
        if (!takers.empty()) takers += ", ";
        takers += P::name;
        if (o.help == first.help && o.default_text() == first.default_text()) continue;
        variants += std::string(18, ' ');
        variants += P::name;
        variants += ": ";
        variants += o.help;
        variants += ", default ";
        variants += o.kind == registry::Kind::path ? "none" : o.default_text();
        variants += '\n';
      }
    });
    out += std::string(16, ' ');
    out += "default ";
    out += first.kind == registry::Kind::path ? "none" : first.default_text();
    out += " (";
    out += takers;
    out += ")\n";
    out += variants;
  }
  return out;
}

}  // namespace kvpolicy::cli
