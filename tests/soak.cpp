// Soak: many decode steps with eviction on a multi-sequence paged cache (docs/reliability.md).
//
//   kvpolicy_soak [--steps N]      (default 1000000)
//
// Four sequences decode round-robin through one cache per registered policy whose memory is
// bounded (registry.hpp: a policy added tomorrow gets a lane with no edit; the bound is its
// evictor's, evict::memory_bound), built from its registry entry with M = 32, B = 8 (WG-KV: M_avg
// = 32, W_local = 8, tau = 0.1; DBTrimKV: h = 2), and the WG-KV admission + TRIM-KV eviction
// composition, which no entry names. The caches share nothing. Every so often a sequence finishes
// and a new one takes its place. After every step it checks that
//   - pages are conserved: free + held by the live sequences = the pool;
//   - memory stays within the evictor's bound, per head and per sequence, and the pool pages a
//     sequence holds never exceed what that bound needs;
//   - attention outputs are finite;
// at the end, that every lane evicted entries and some sequence came within a quarter of its bound
// (the bound is one the run pressed against); and that nothing grows over time: the heap in use
// (mallinfo2) and the resident set size at the end are those of the first 10% of the run, within a
// small slack. Exit status 0 when every check holds; the first failure is printed with its step.
// The policies whose memory grows by design (the full cache, the prompt-only compressions, WG-KV
// without a budget) are listed, with no lane.
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/registry.hpp"

using namespace kvpolicy;

namespace {

constexpr int kPage = 16;
constexpr std::int64_t kBudget = 32, kBuffer = 8, kLocal = 8, kSequences = 4;
const CacheShape kShape{2, 2, 4, 16};
using Pool = memory::Paged<kPage>;

[[noreturn]] void die(std::int64_t step, const std::string& what) {
  std::fprintf(stderr, "soak: FAILED at step %lld: %s\n", static_cast<long long>(step), what.c_str());
  std::exit(1);
}

std::int64_t heap_in_use() { return static_cast<std::int64_t>(mallinfo2().uordblks); }

std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * 4096;
}

std::int64_t pages_for(std::int64_t entries) { return (entries + kPage - 1) / kPage; }

// The pages a sequence may hold after a step under `bound`: its entries and each head's partly
// filled last page.
std::int64_t sequence_pages(const evict::MemoryBound& bound) { return pages_for(bound.per_sequence) + kShape.heads_total(); }
// The pool of every lane: each sequence at its bound, and during a step one entry more per head.
Pool pool_for(const evict::MemoryBound& bound) {
  return Pool(kSequences * (pages_for(bound.per_sequence + kShape.heads_total()) + kShape.heads_total()));
}

// One decode token of every layer: K/V, and per (layer, kv head) a log_beta, a frozen score and a
// write gate g; the queries and the attention output.
struct Token {
  View<const float, 4> keys, values;
  View<const float, 3> log_beta, score, gate;
  View<const float, 4> queries;
  View<float, 4> out;
};

// Which of the token's per-entry floats a policy takes as append's metadata.
enum class Meta { log_beta, score, gate };

// One cache with its live sequences, stepped one decode token at a time (LaneOf<C> for a Cache C).
struct Lane {
  virtual ~Lane() = default;
  virtual void start(std::int64_t slot) = 0;
  virtual void restart(std::int64_t slot) = 0;
  virtual bool step(std::int64_t slot, const Token& t) = 0;
  virtual void check(std::int64_t step) const = 0;

  std::string name;
  evict::MemoryBound bound;  // entries a head and a sequence may hold after a step
  Meta meta = Meta::log_beta;
  bool gate = false;  // append's gate (an Admitter that reads it)
  std::vector<std::int64_t> live = std::vector<std::int64_t>(kSequences);
  std::int64_t next_id = 0;
  std::int64_t evicted = 0;       // entries the steps removed
  std::int64_t most_entries = 0;  // the most a sequence held after a step

  Lane(std::string n, evict::MemoryBound b, Meta m, bool g) : name(std::move(n)), bound(b), meta(m), gate(g) {}
};

template <class C>
struct LaneOf final : Lane {
  C cache;

  LaneOf(C c, std::string n, evict::MemoryBound b, Meta m, bool g) : Lane(std::move(n), b, m, g), cache(std::move(c)) {}

  void start(std::int64_t slot) override {
    live[static_cast<std::size_t>(slot)] = next_id;
    cache.add_sequence(next_id++);
  }
  void restart(std::int64_t slot) override {
    cache.remove_sequence(live[static_cast<std::size_t>(slot)]);
    start(slot);
  }
  // One decode step of the sequence in `slot`; whether the evictor's trigger fired.
  bool step(std::int64_t slot, const Token& t) override {
    const View<const float, 3> m = meta == Meta::log_beta ? t.log_beta : meta == Meta::score ? t.score : t.gate;
    const std::int64_t seq = live[static_cast<std::size_t>(slot)];
    const EvictionReport r = cache.step(
        typename C::SequenceStep{seq, t.keys, t.values, m, t.queries, t.out, gate ? t.gate : View<const float, 3>{}});
    evicted += r.evicted;
    most_entries = std::max(most_entries, cache.total_length(seq));
    return r.triggered;
  }

  void check(std::int64_t step) const override {
    std::int64_t used = 0;
    const std::int64_t pages_bound = sequence_pages(bound);
    for (auto seq : live) {
      used += cache.allocator().pages_used(seq);
      if (cache.allocator().pages_used(seq) > pages_bound)
        die(step, name + ": sequence " + std::to_string(seq) + " holds " +
                      std::to_string(cache.allocator().pages_used(seq)) + " pages > " + std::to_string(pages_bound));
      if (cache.total_length(seq) > bound.per_sequence)
        die(step, name + ": sequence " + std::to_string(seq) + " holds " + std::to_string(cache.total_length(seq)) +
                      " entries > " + std::to_string(bound.per_sequence));
      for (int l = 0; l < kShape.layers; ++l)
        for (int h = 0; h < kShape.kv_heads; ++h)
          if (cache.length(seq, l, h) > bound.per_head)
            die(step, name + ": a head holds " + std::to_string(cache.length(seq, l, h)) + " entries > " +
                          std::to_string(bound.per_head));
    }
    const auto& a = cache.allocator();
    if (used + a.pages_free() != a.pages_total())
      die(step, name + ": pages not conserved: " + std::to_string(used) + " used + " + std::to_string(a.pages_free()) +
                    " free != " + std::to_string(a.pages_total()));
  }
};

// The soak's option values for registered policy P: the budgets above where it takes them, its
// defaults for the rest.
template <registry::Policy P>
registry::Values soak_values() {
  const std::map<std::string, std::string> soak{{"budget", std::to_string(kBudget)}, {"buffer", std::to_string(kBuffer)},
                                                {"avg-budget", std::to_string(kBudget)}, {"local", std::to_string(kLocal)},
                                                {"tau", "0.1"}, {"horizon", "2"}};
  std::map<std::string, std::string, std::less<>> given;
  for (const registry::Option& o : P::options)
    if (const auto it = soak.find(std::string(o.name)); it != soak.end()) given[it->first] = it->second;
  return registry::Values(P::name, P::options, given);
}

// A lane for registered policy P when its evictor bounds its memory; none when it grows by design.
template <registry::Policy P>
std::unique_ptr<Lane> lane_of() {
  // the policy's parts, from a Cache of one page (the parts are what is wanted)
  return P::template make<cpu_backend>(soak_values<P>(), kShape, Pool(1), [&](auto& parts) -> std::unique_ptr<Lane> {
    using Parts = std::decay_t<decltype(parts)>;
    using S = typename Parts::scorer_type;
    using A = typename Parts::admitter_type;
    using C = Cache<S, A, std::decay_t<decltype(parts.evictor())>, Pool, cpu_backend>;
    const auto bound = evict::memory_bound(parts.evictor(), kShape);
    if (!bound) return nullptr;
    const Meta meta = P::inputs::scores == inputs::Scores::gate ? Meta::gate
                      : scorer_static_score<S>                  ? Meta::score
                                                                : Meta::log_beta;
    return std::make_unique<LaneOf<C>>(C(kShape, pool_for(*bound), parts.evictor(), parts.scorer(), parts.admitter()),
                                       std::string(P::name), *bound, meta, admitter_reads_gate<A>);
  });
}

int soak(std::int64_t steps, const std::vector<std::string>& grows, const std::vector<std::unique_ptr<Lane>>& lanes) {
  const auto each_lane = [&](auto&& f) {
    for (const auto& lane : lanes) f(*lane);
  };
  for (std::int64_t s = 0; s < kSequences; ++s) each_lane([&](auto& lane) { lane.start(s); });

  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> retention(-0.3f, 0.0f), unit(0.0f, 1.0f);
  const std::int64_t L = kShape.layers, H = kShape.kv_heads, Hq = kShape.q_heads, d = kShape.head_dim;
  std::vector<float> k(static_cast<std::size_t>(L * H * d)), v(k.size()), lb(static_cast<std::size_t>(L * H)),
      score(lb.size()), g(lb.size()), q(static_cast<std::size_t>(L * Hq * d)), out(q.size());
  const Token token{View<const float, 4>(k.data(), {L, H, 1, d}), View<const float, 4>(v.data(), {L, H, 1, d}),
                    View<const float, 3>(lb.data(), {L, H, 1}),   View<const float, 3>(score.data(), {L, H, 1}),
                    View<const float, 3>(g.data(), {L, H, 1}),    View<const float, 4>(q.data(), {L, Hq, 1, d}),
                    View<float, 4>(out.data(), {L, Hq, 1, d})};

  const std::int64_t warm = steps / 10;
  std::int64_t heap_warm = 0, rss_warm = 0, heap_max = 0, rss_max = 0, evictions = 0;
  for (std::int64_t step = 0; step < steps; ++step) {
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (auto& x : q) x = normal(rng);
    for (auto& x : lb) x = retention(rng);
    for (auto& x : score) x = normal(rng);
    for (auto& x : g) x = unit(rng);
    const std::int64_t slot = step % kSequences;
    // a sequence ends after a random length and a new one starts (pages go back, then are reused)
    if (step % 997 == 0 && step > 0) {
      const auto s = static_cast<std::int64_t>(rng() % kSequences);
      each_lane([&](auto& lane) { lane.restart(s); });
    }
    each_lane([&](auto& lane) {
      std::fill(out.begin(), out.end(), std::nanf(""));
      evictions += lane.step(slot, token);
      for (float x : out)
        if (!std::isfinite(x)) die(step, lane.name + ": attention output is not finite");
      lane.check(step);
    });
    if (step == warm) {
      heap_warm = heap_in_use();
      rss_warm = resident_bytes();
    }
    if (step > warm && step % 1000 == 0) {
      heap_max = std::max(heap_max, heap_in_use());
      rss_max = std::max(rss_max, resident_bytes());
    }
  }
  each_lane([&](auto& lane) {
    if (lane.evicted == 0) die(steps, lane.name + ": no step evicted anything");
    if (4 * lane.most_entries < 3 * lane.bound.per_sequence)
      die(steps, lane.name + ": no sequence came within a quarter of its bound (" + std::to_string(lane.most_entries) +
                     " entries; the bound is " + std::to_string(lane.bound.per_sequence) + ")");
  });
  const std::int64_t heap_end = heap_in_use(), rss_end = resident_bytes();
  std::int64_t sequences = 0;
  each_lane([&](auto& lane) {
    sequences += lane.next_id;
    std::printf("soak: %-12s evicted %lld entries; a sequence held at most %lld (bound %lld)\n", lane.name.c_str(),
                static_cast<long long>(lane.evicted), static_cast<long long>(lane.most_entries),
                static_cast<long long>(lane.bound.per_sequence));
  });
  std::string unbounded;
  for (const std::string& name : grows) unbounded += (unbounded.empty() ? "" : ", ") + name;
  std::printf("soak: %lld steps through %d caches, %lld evictions, %lld sequences; no lane (memory grows by design): %s\n",
              static_cast<long long>(steps), static_cast<int>(lanes.size()), static_cast<long long>(evictions),
              static_cast<long long>(sequences), unbounded.c_str());
  std::printf("soak: heap in use %lld bytes at 10%%, %lld at the end (max %lld); resident %lld -> %lld bytes (max %lld)\n",
              static_cast<long long>(heap_warm), static_cast<long long>(heap_end), static_cast<long long>(heap_max),
              static_cast<long long>(rss_warm), static_cast<long long>(rss_end), static_cast<long long>(rss_max));
  // Slack: allocator bookkeeping may shift a little; growth per step would be far beyond these.
  if (heap_end > heap_warm + 64 * 1024) die(steps, "the heap in use grew from " + std::to_string(heap_warm) + " to " + std::to_string(heap_end));
  if (rss_end > rss_warm + 4 * 1024 * 1024) die(steps, "the resident set grew from " + std::to_string(rss_warm) + " to " + std::to_string(rss_end));
  std::printf("soak: PASSED\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t steps = 1000000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: kvpolicy_soak [--steps N]\n");
      return 2;
    }
  }
  if (steps < 100) {
    std::fprintf(stderr, "soak: --steps %lld: at least 100\n", static_cast<long long>(steps));
    return 2;
  }
  // the WG-KV + TRIM-KV composition, then every registered policy with a bound
  std::vector<std::unique_ptr<Lane>> lanes;
  const auto retention = trimkv_evictor({.budget = kBudget, .buffer = kBuffer});
  const auto bound = *evict::memory_bound(retention, kShape);
  using Composed = WGKVRetentionCache<cpu_backend, float, kPage>;
  lanes.push_back(std::make_unique<LaneOf<Composed>>(
      Composed(kShape, pool_for(bound), retention, {}, wgkv_admitter({.local = kLocal, .tau = 0.1})), "wgkv+trimkv", bound,
      Meta::log_beta, true));
  std::vector<std::string> grows;
  registry::for_each([&]<registry::Policy P>() {
    if (auto lane = lane_of<P>()) lanes.push_back(std::move(lane));
    else grows.emplace_back(P::name);
  });
  return soak(steps, grows, lanes);
}
