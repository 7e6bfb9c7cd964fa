// Every registered policy that runs on the device (registry::runs_on, which reads the parts the
// device executor takes: cuda/device_parts.hpp) against itself on the CPU: its registry entry
// builds the parts with small budgets, and a CPU Cache and a device Cache of those parts take the
// same random stream (drive.hpp: the same entries bit for bit, the same evictions and free pages,
// attention within 1e-5). A policy registered tomorrow runs here with no edit; one whose parts the
// device does not run is skipped by name (and the README's table says so, from the same answer).
// A policy with a token-level mode (SPEC §8, `--mode union`) runs in both of its modes.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kvpolicy/cuda/backend.cuh"
#include "kvpolicy/runs_on.hpp"
#include "drive.hpp"
#include "test_scale.hpp"

namespace kp = kvpolicy;

namespace {

template <class L>
struct as_tuple;
template <class... P>
struct as_tuple<kp::registry::detail::list<P...>> {
  using type = std::tuple<P...>;
};
using Registered = typename as_tuple<kp::registry::all>::type;

// Small values of the options a policy takes (its defaults for the rest): budgets a stream of 60
// steps overruns, and the prompt-compressing policies' window inside their budget; `mode` where the
// policy takes one.
template <kp::registry::Policy P>
kp::registry::Values small_values(const std::string& mode) {
  const std::map<std::string, std::string> small{{"budget", "12"}, {"buffer", "2"}, {"window", "2"}, {"sinks", "1"},
                                                 {"local", "4"},   {"tau", "0.5"},  {"horizon", "2"}, {"beta", "2"},
                                                 {"recency", "2"}};
  std::map<std::string, std::string, std::less<>> given;
  for (const kp::registry::Option& o : P::options)
    if (const auto it = small.find(std::string(o.name)); it != small.end()) given[it->first] = it->second;
  if (!mode.empty()) given["mode"] = mode;
  return kp::registry::Values(P::name, P::options, given);
}

// The policy's modes: its per-head one, and its token-level one where it offers it.
template <kp::registry::Policy P>
std::vector<std::string> modes() {
  for (const kp::registry::Option& o : P::options)
    if (o.name == kp::registry::option::mode.name) return {"per-head", "union"};
  return {""};
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("a registered policy on the device keeps what it keeps on the CPU", P, registered_on_device) {
  for (const std::string& mode : modes<P>()) {
    CAPTURE(mode);
    const kp::registry::Values v = small_values<P>(mode);
    if (!kp::registry::runs_on<P, kp::cuda_backend>(v)) {
      MESSAGE(P::name, " ", mode, ": its parts run on the CPU only (registry::runs_on)");
      continue;
    }
    const kp::CacheShape shape{2, 2, 4, 64};
    // 120 steps on a GPU; 16 under a simulator, where the policies with cases of their own
    // (test_cache.cu) run longer streams, and this case checks the composition the registry builds
    const int steps = cudatest::test_scale() > 1 ? 16 : 120;
    const std::int64_t pages = 6 * shape.heads_total() * 8;
    using Pool = kp::memory::Paged<16>;
    // the parts, from the entry's CPU Cache of one page; both Caches are built from them
    P::template make<kp::cpu_backend>(v, shape, Pool(1), [&](auto& parts) {
      using Parts = std::decay_t<decltype(parts)>;
      using S = typename Parts::scorer_type;
      using A = typename Parts::admitter_type;
      using E = std::decay_t<decltype(parts.evictor())>;
      if constexpr (kp::gpu::device_runs<S, A, E>) {
        for (std::uint64_t seed = 1; seed <= cudatest::seeds(4); ++seed) {
          kp::Cache<S, A, E, Pool, kp::cpu_backend> cpu(shape, Pool(pages), parts.evictor(), parts.scorer(), parts.admitter());
          kp::Cache<S, A, E, Pool, kp::cuda_backend> gpu(shape, Pool(pages), parts.evictor(), parts.scorer(), parts.admitter());
          const cudatest::DriveOptions options{.attend_prefill = kp::detail::ScorerRecords<S>::observes_attention,
                                               .declare_prompt = requires { P::needs_prompt_length; },
                                               .steps = steps};
          std::int64_t evicted = 0;
          if constexpr (P::inputs::scores == kp::inputs::Scores::gate)  // g in [0, 1], ties at tau
            evicted = cudatest::drive(cpu, gpu, shape, seed * 23, 1e-5, [](std::mt19937_64& rng) {
              static const float g[] = {0.0f, 0.25f, 0.5f, 0.5f, 1.0f};
              return g[std::uniform_int_distribution<int>(0, 4)(rng)];
            }, options);
          else if constexpr (kp::scorer_static_score<S>)  // frozen scores with ties
            evicted = cudatest::drive(cpu, gpu, shape, seed * 23, 1e-5, [](std::mt19937_64& rng) {
              return static_cast<float>(std::uniform_int_distribution<int>(-4, 4)(rng)) * 0.5f;
            }, options);
          else
            evicted = cudatest::drive(cpu, gpu, shape, seed * 23, 1e-5, cudatest::tie_prone_log_beta, options);
          if (!P::options.empty() && cudatest::test_scale() == 1)
            CHECK_MESSAGE(evicted > 0, P::name, ": the stream evicted nothing");
        }
      } else {
        FAIL(P::name, " ", mode, ": registry::runs_on says the device runs it, and its parts are not the device's");
      }
    });
  }
}
TEST_CASE_TEMPLATE_APPLY(registered_on_device, Registered);
