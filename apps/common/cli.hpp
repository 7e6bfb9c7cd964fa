// Command-line values of the applications (kvpolicy-lm, kvpolicy-llama, kvpolicy-replay): a flag's
// value is a number only if all of it parses, and an integer only if that number is whole; anything
// else is an error that names the flag and the value.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <kvpolicy/core/error.hpp>
#include <kvpolicy/registry.hpp>
#include <kvpolicy/runs_on.hpp>

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

/// --list-policies: one registered policy per line, for scripts (kvpolicy-quality):
/// name, its options (comma-separated, "-" for none), what its entries need from the forward pass
/// (its input source's name, inputs/source.hpp), "prompt" when it compresses a prompt the engine declares, else "-", and
/// "cuda" when it runs on the device with its defaults (registry::runs_on), else "-"; tab-separated.
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
    out += P::inputs::name;
    out += registry::needs_prompt_length_v<P> ? "\tprompt" : "\t-";
    out += registry::runs_on<P, cuda_backend>() ? "\tcuda\n" : "\t-\n";
  });
  return out;
}

/// --list-options: every registered policy's options as a Markdown table (docs/policies.md's
/// "Options", which a test keeps equal to it): policy, option, default, the values it takes, help.
inline std::string policy_options_table() {
  const auto cell = [](std::string_view text) {  // a table cell: '|' escaped
    std::string out;
    for (const char c : text) {
      if (c == '|') out += '\\';
      out += c;
    }
    return out;
  };
  std::string out = "| policy | option | default | values | what it sets |\n| --- | --- | --- | --- | --- |\n";
  registry::for_each([&]<registry::Policy P>() {
    for (const registry::Option& o : P::options) {
      std::string values;
      switch (o.kind) {
        case registry::Kind::path: values = "a file"; break;
        case registry::Kind::choice:
          for (const std::string_view c : o.choices)
            if (!c.empty()) values += (values.empty() ? "`" : ", `") + std::string(c) + "`";
          break;
        case registry::Kind::integer:
        case registry::Kind::real: {
          const bool bounded = o.minimum > -1.0e300;
          std::string least = registry::Option{o.name, o.kind, o.minimum, ""}.default_text();
          values = std::string(o.kind == registry::Kind::integer ? "integer" : "real") +
                   (bounded ? " >= " + least : "");
          break;
        }
      }
      out += "| `" + std::string(P::name) + "` | `--" + std::string(o.name) + "` | " +
             (o.kind == registry::Kind::path ? std::string("none") : "`" + o.default_text() + "`") + " | " + values +
             " | " + cell(o.help) + " |\n";
    }
  });
  return out;
}

/// The policies and their options, from the registry (kvpolicy/registry.hpp), for a tool's --help:
/// each option once, with the help and default most of its takers state, then the takers that
/// state it otherwise.
inline std::string policy_help() {
  const auto column = [](std::string& out, std::string_view first, std::string_view second) {
    out += "  ";
    out += first;
    out.append(first.size() < 14 ? 14 - first.size() : 1, ' ');
    out += second;
    out += '\n';
  };
  const auto shown_default = [](const registry::Option& o) {
    return o.kind == registry::Kind::path ? std::string("none") : o.default_text();
  };
  std::string out = "policies:\n";
  registry::for_each([&]<registry::Policy P>() { column(out, P::name, P::help); });
  out += "\npolicy options (a policy refuses an option it does not take):\n";
  for (const registry::Option& first : registry::all_options()) {
    struct Statement {
      std::string_view policy;
      registry::Option option;
    };
    std::vector<Statement> stated;
    registry::for_each([&]<registry::Policy P>() {
      for (const registry::Option& o : P::options)
        if (o.name == first.name) stated.push_back({P::name, o});
    });
    const auto same = [&](const registry::Option& a, const registry::Option& b) {
      return a.help == b.help && shown_default(a) == shown_default(b);
    };
    const registry::Option* common = &stated.front().option;  // the statement most takers share
    std::size_t most = 0;
    for (const Statement& s : stated) {
      const auto n = static_cast<std::size_t>(
          std::count_if(stated.begin(), stated.end(), [&](const Statement& t) { return same(s.option, t.option); }));
      if (n > most) {
        most = n;
        common = &s.option;
      }
    }
    column(out, "--" + std::string(first.name), common->help);
    std::string takers, variants;
    for (const Statement& s : stated) {
      if (!takers.empty()) takers += ", ";
      takers += s.policy;
      if (same(s.option, *common)) continue;
      variants += std::string(18, ' ');
      variants += s.policy;
      variants += ": ";
      variants += s.option.help;
      variants += ", default ";
      variants += shown_default(s.option);
      variants += '\n';
    }
    out += std::string(16, ' ');
    out += "default ";
    out += shown_default(*common);
    out += " (";
    out += takers;
    out += ")\n";
    out += variants;
  }
  return out;
}

}  // namespace kvpolicy::cli
