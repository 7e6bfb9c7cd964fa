// The flags the applications share (apps/common/run_flags.hpp): each taken once, the checks every
// model run makes, and errors that name the flag and its value.
#include <doctest/doctest.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "../apps/common/run_flags.hpp"

using namespace kvpolicy;

namespace {

using Flags = std::initializer_list<std::pair<std::string, std::string>>;

apps::RunFlags given(Flags flags) {
  apps::RunFlags f;
  for (const auto& [flag, value] : flags) REQUIRE(f.take(flag, value));
  return f;
}

}  // namespace

TEST_CASE("apps::RunFlags: the shared flags and the policy's options are taken, a program's own are left to it") {
  apps::RunFlags f = given({{"--model", "m"}, {"--text", "t.txt"}, {"--tokens", "512"}, {"--chunk", "32"},
                            {"--score-from", "7"}, {"--generate", "5"}, {"--survivors", "s.txt"},
                            {"--policy", "trimkv"}, {"--budget", "64"}, {"--threads", "3"}});
  CHECK_FALSE(f.take("--golden", "g"));
  CHECK_FALSE(f.take("--no-such-flag", "1"));
  f.finish("prog", "DIR", "full");
  CHECK(f.model == "m");
  CHECK(f.text == "t.txt");
  CHECK(f.survivors == "s.txt");
  CHECK(f.tokens == 512);
  CHECK(f.score_from == 7);
  CHECK(f.generate == 5);
  CHECK(f.prefill == 32);  // the first step defaults to --chunk
  CHECK(f.threads == 3);
  CHECK(f.selection.policy == "trimkv");
  CHECK(f.selection.value("budget") == "64");

  apps::RunFlags p = given({{"--model", "m"}, {"--prompt", "a"}, {"--prompt", "b"}, {"--generate", "4"}, {"--prefill", "8"},
                            {"--score-from", "0"}});  // prompts are not scored: --score-from is not read
  p.finish("prog", "DIR", "full");
  CHECK(p.prompts == std::vector<std::string>{"a", "b"});
  CHECK(p.prefill == 8);
  CHECK(p.selection.policy == "full");  // the program's default
  apps::RunFlags none = given({{"--model", "m"}, {"--text", "t"}});
  none.finish("prog", "GGUF", "");
  CHECK(none.selection.policy.empty());
}

TEST_CASE("apps::RunFlags: refusals name the flag and the value") {
  const auto refused = [](Flags flags, const std::string& why) {
    apps::RunFlags f = given(flags);
    CHECK_THROWS_WITH(f.finish("prog", "GGUF", "full"), doctest::Contains(why.c_str()));
  };
  refused({{"--text", "t"}}, "--model GGUF is required (prog --help)");
  refused({{"--model", "m"}}, "give either --text FILE or --prompt TEXT");
  refused({{"--model", "m"}, {"--text", "t"}, {"--prompt", "p"}}, "give either --text FILE or --prompt TEXT");
  refused({{"--model", "m"}, {"--prompt", "p"}}, "--prompt needs --generate N >= 1");
  refused({{"--model", "m"}, {"--text", "t"}, {"--tokens", "1"}}, "--tokens 1 must be >= 2");
  refused({{"--model", "m"}, {"--text", "t"}, {"--tokens", "64"}, {"--score-from", "64"}},
          "--score-from 64 must be in [1, --tokens 64)");
  refused({{"--model", "m"}, {"--text", "t"}, {"--score-from", "0"}}, "--score-from 0 must be in [1, --tokens 1024)");
  refused({{"--model", "m"}, {"--text", "t"}, {"--chunk", "0"}}, "--chunk 0 must be >= 1");
  refused({{"--model", "m"}, {"--text", "t"}, {"--prefill", "-1"}}, "--prefill -1 must be >= 0");
  refused({{"--model", "m"}, {"--text", "t"}, {"--generate", "-1"}}, "--generate -1 must be >= 0");
  refused({{"--model", "m"}, {"--text", "t"}, {"--threads", "-1"}}, "--threads -1 must be >= 0");
  refused({{"--model", "m"}, {"--text", "t"}, {"--budget", "64"}}, "a policy option (--budget) needs --policy");
  apps::RunFlags f;
  CHECK_THROWS_WITH(f.take("--prompt", ""), doctest::Contains("--prompt: an empty prompt"));
  CHECK(f.prompts.empty());
  CHECK_THROWS_WITH(f.take("--tokens", "12x"), doctest::Contains("--tokens: '12x' is not a number"));
  CHECK_THROWS_WITH(f.take("--chunk", "1.5"), doctest::Contains("--chunk: '1.5' is not an integer"));
  CHECK(f.tokens == 1024);  // a refused value changes nothing
  CHECK_THROWS_WITH(apps::read_file("--text", "/no/such/file"), doctest::Contains("--text: cannot open '/no/such/file'"));
  CHECK(apps::read_file("--text", KVPOLICY_SOURCE_DIR "/LICENSE").size() > 100);
}

TEST_CASE("apps::RunFlags::read: a program's switches and own flags first, then the shared ones, and an unknown flag or a missing value refused") {
  const auto read = [](std::vector<std::string> args, bool& on, std::string& own) {
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    apps::RunFlags f;
    f.read(static_cast<int>(argv.size()), argv.data(), "prog", "usage", {{"--switch", &on}},
           [&own](const std::string& flag, const std::string& v) {
             if (flag != "--own") return false;
             own = v;
             return true;
           });
    return f;
  };
  bool on = false;
  std::string own;
  const apps::RunFlags f = read({"--model", "m", "--switch", "--own", "x", "--budget", "64", "--policy", "tova"}, on, own);
  CHECK(on);
  CHECK(own == "x");
  CHECK(f.model == "m");
  CHECK(f.selection.policy == "tova");
  CHECK(f.selection.value("budget") == "64");
  bool off = false;
  CHECK_THROWS_WITH(read({"--model", "m", "--golden", "g"}, off, own), doctest::Contains("unknown flag --golden (prog --help)"));
  CHECK_THROWS_WITH(read({"--model"}, off, own), doctest::Contains("--model: needs a value (prog --help)"));
  CHECK_FALSE(off);
}
