// The flags every model-running program takes (kvpolicy-lm, kvpolicy-llama): the model, the text or
// prompts, the steps, the policy and its options; parsed and checked once here, each program adding
// its own flags and checks around them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/registry.hpp"

namespace kvpolicy::apps {

/// --help (the program's usage, then the policies and their options), --list-policies and
/// --list-options: printed, and the program ends; any other flag returns.
inline void answer_info_flag(const std::string& flag, const char* usage) {
  if (flag == "-h" || flag == "--help") {
    std::fputs(usage, stdout);
    std::fputs("\n", stdout);
    std::fputs(cli::policy_help().c_str(), stdout);
    std::exit(0);
  }
  if (flag == "--list-policies") {
    std::fputs(cli::policy_list().c_str(), stdout);
    std::exit(0);
  }
  if (flag == "--list-options") {
    std::fputs(cli::policy_options_table().c_str(), stdout);
    std::exit(0);
  }
}

/// A run of a model over a text or prompts, through a policy chosen by name.
struct RunFlags {
  std::string model, text, survivors;
  std::vector<std::string> prompts;
  std::int64_t tokens = 1024, score_from = 1, prefill = 0, chunk = 16, generate = 0;
  int threads = 0;
  /// --policy and its options as given (registry::Selection); `finish` names the default policy
  registry::Selection selection;

  /// Reads a program's command line: --help and --list-policies answered (answer_info_flag), a
  /// flag named in `switches` sets its bool, and every other flag takes the next argument as its
  /// value, offered first to `own(flag, value)` (the program's own flags: true when it took it),
  /// then to take(); a flag neither takes, or one missing its value, is refused. finish() follows.
  template <class Own>
  void read(int argc, char** argv, std::string_view program, const char* usage,
            std::initializer_list<std::pair<std::string_view, bool*>> switches, Own&& own) {
    const std::string help = " (" + std::string(program) + " --help)";
    for (int i = 1; i < argc; ++i) {
      const std::string f = argv[i];
      answer_info_flag(f, usage);
      bool* on = nullptr;
      for (const auto& [name, flag] : switches)
        if (f == name) on = flag;
      if (on) {
        *on = true;
        continue;
      }
      require(i + 1 < argc, f, ": needs a value", help);
      const std::string v = argv[++i];
      if (!own(f, v) && !take(f, v)) fail("unknown flag ", f, help);
    }
  }

  /// Takes `flag` with its value `v` when it is one of the shared flags or a registered policy
  /// option; false for a flag the program must take itself.
  bool take(const std::string& flag, const std::string& v) {
    if (flag == "--model") model = v;
    else if (flag == "--text") text = v;
    else if (flag == "--survivors") survivors = v;
    else if (flag == "--prompt") {
      require(!v.empty(), "--prompt: an empty prompt");
      prompts.push_back(v);
    }
    else if (flag == "--tokens") tokens = cli::integer(flag, v);
    else if (flag == "--score-from") score_from = cli::integer(flag, v);
    else if (flag == "--prefill") prefill = cli::integer(flag, v);
    else if (flag == "--chunk") chunk = cli::integer(flag, v);
    else if (flag == "--generate") generate = cli::integer(flag, v);
    else if (flag == "--threads") threads = static_cast<int>(cli::integer(flag, v));
    else if (flag == "--policy") selection.policy = v;
    else if (flag.starts_with("--") && registry::is_option(flag.substr(2))) selection.set(flag.substr(2), v);
    else return false;
    return true;
  }

  /// The checks every program makes once all flags are read; the first step's tokens default to
  /// --chunk, and the policy to `default_policy` (empty: none). `model_kind` says what --model
  /// names (DIR, GGUF).
  void finish(std::string_view program, std::string_view model_kind, std::string_view default_policy) {
    const std::string help = " (" + std::string(program) + " --help)";
    require(!model.empty(), "--model ", model_kind, " is required", help);
    require(text.empty() != prompts.empty(), "give either --text FILE or --prompt TEXT", help);
    require(prompts.empty() || generate >= 1, "--prompt needs --generate N >= 1");
    require(tokens >= 2, "--tokens ", tokens, " must be >= 2");
    // a text's perplexity is scored from --score-from on; prompts are not scored
    require(!prompts.empty() || (score_from >= 1 && score_from < tokens), "--score-from ", score_from,
            " must be in [1, --tokens ", tokens, ")");
    require(chunk >= 1, "--chunk ", chunk, " must be >= 1");
    require(prefill >= 0, "--prefill ", prefill, " must be >= 0");
    require(generate >= 0, "--generate ", generate, " must be >= 0");
    require(threads >= 0, "--threads ", threads, " must be >= 0");
    require(!selection.policy.empty() || selection.given.empty(), "a policy option (--",
            selection.given.empty() ? std::string() : selection.given.begin()->first, ") needs --policy");
    if (prefill == 0) prefill = chunk;
    if (selection.policy.empty()) selection.policy = std::string(default_policy);
  }
};

/// The whole of the file at `path`; an error names `flag` and the path where it cannot be read.
inline std::string read_file(std::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), flag, ": cannot open '", path, "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace kvpolicy::apps
