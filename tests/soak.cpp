// Soak: many decode steps with eviction on a multi-sequence paged cache (docs/reliability.md).
//
//   kvpolicy_soak [--steps N]      (default 1000000)
//
// Four sequences decode round-robin through a TRIM-KV cache and a DBTrimKV (global budget) cache
// sharing nothing; every so often a sequence finishes and a new one takes its place. After every
// step it checks that
//   - pages are conserved: free + held by the live sequences = the pool;
//   - memory stays bounded: every head holds at most M + B - 1 entries (TRIM-KV), every sequence at
//     most L Hkv (M + B) - 1 (DBTrimKV), and the pool pages in use never exceed what those bounds
//     need (budget + buffer, in pages);
// and that nothing grows over time: the heap in use (mallinfo2) and the resident set size at the
// end are those of the first 10% of the run, within a small slack. Exit status 0 when every check
// holds; the first failure is printed with its step.
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/trimkv.hpp"

using namespace kvpolicy;

namespace {

constexpr int kPage = 16;
constexpr std::int64_t kBudget = 32, kBuffer = 8, kSequences = 4;
const CacheShape kShape{2, 2, 4, 16};

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

// One cache with its live sequences, stepped one decode token at a time.
template <class C>
struct Lane {
  C cache;
  const char* name;
  std::int64_t per_head_bound;  // entries a head may hold after a step
  std::int64_t per_seq_bound;   // entries a sequence may hold after a step
  std::int64_t pages_bound;     // pages a sequence may hold after a step (the budget + buffer, in pages)
  std::vector<std::int64_t> live;
  std::int64_t next_id = 0;

  void start(std::int64_t slot) {
    live[static_cast<std::size_t>(slot)] = next_id;
    cache.add_sequence(next_id++);
  }

  void check(std::int64_t step) const {
    std::int64_t used = 0;
    for (auto seq : live) {
      used += cache.allocator().pages_used(seq);
      if (cache.allocator().pages_used(seq) > pages_bound)
        die(step, std::string(name) + ": sequence " + std::to_string(seq) + " holds " +
                      std::to_string(cache.allocator().pages_used(seq)) + " pages > " + std::to_string(pages_bound));
      if (cache.total_length(seq) > per_seq_bound)
        die(step, std::string(name) + ": sequence " + std::to_string(seq) + " holds " +
                      std::to_string(cache.total_length(seq)) + " entries > " + std::to_string(per_seq_bound));
      for (int l = 0; l < kShape.layers; ++l)
        for (int h = 0; h < kShape.kv_heads; ++h)
          if (cache.length(seq, l, h) > per_head_bound)
            die(step, std::string(name) + ": a head holds " + std::to_string(cache.length(seq, l, h)) + " entries > " +
                          std::to_string(per_head_bound));
    }
    const auto& a = cache.allocator();
    if (used + a.pages_free() != a.pages_total())
      die(step, std::string(name) + ": pages not conserved: " + std::to_string(used) + " used + " +
                    std::to_string(a.pages_free()) + " free != " + std::to_string(a.pages_total()));
  }
};

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

  const std::int64_t heads = kShape.heads_total();
  // TRIM-KV: a head holds at most M + B entries during a step (the triggering one), M + B - 1 after.
  const std::int64_t trim_pages = pages_for(kBudget + kBuffer) * heads * kSequences;
  Lane<TrimKVCache<cpu_backend, float, kPage>> trim{
      TrimKVCache<cpu_backend, float, kPage>(kShape, memory::Paged<kPage>(trim_pages), trimkv_evictor({kBudget, kBuffer})),
      "trimkv", kBudget + kBuffer - 1, heads * (kBudget + kBuffer - 1), heads * pages_for(kBudget + kBuffer - 1),
      std::vector<std::int64_t>(kSequences), 0};
  // DBTrimKV: the sequence total stays below L Hkv (M + B); one head may hold most of it.
  const std::int64_t global_bound = heads * (kBudget + kBuffer) - 1;
  // pages: each head's partly filled last page on top of the entries; during a step one more entry per head
  const std::int64_t db_pages = (pages_for(global_bound + heads) + heads) * kSequences;
  const DBTrimKVConfig dc{kBudget, kBuffer, 2};
  Lane<DBTrimKVCache<cpu_backend, float, kPage>> db{
      DBTrimKVCache<cpu_backend, float, kPage>(kShape, memory::Paged<kPage>(db_pages), dbtrimkv_evictor(dc),
                                               dbtrimkv_scorer(dc)),
      "dbtrimkv", global_bound, global_bound, pages_for(global_bound) + heads, std::vector<std::int64_t>(kSequences), 0};
  for (std::int64_t s = 0; s < kSequences; ++s) {
    trim.start(s);
    db.start(s);
  }

  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> retention(-0.3f, 0.0f);
  const std::int64_t L = kShape.layers, H = kShape.kv_heads, Hq = kShape.q_heads, d = kShape.head_dim;
  std::vector<float> k(static_cast<std::size_t>(L * H * d)), v(k.size()), lb(static_cast<std::size_t>(L * H)),
      q(static_cast<std::size_t>(L * Hq * d)), out(q.size());

  const std::int64_t warm = steps / 10;
  std::int64_t heap_warm = 0, rss_warm = 0, heap_max = 0, rss_max = 0, evictions = 0;
  for (std::int64_t step = 0; step < steps; ++step) {
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (auto& x : q) x = normal(rng);
    for (auto& x : lb) x = retention(rng);
    const std::int64_t slot = step % kSequences;
    // a sequence ends after a random length and a new one starts (pages go back, then are reused)
    if (step % 997 == 0 && step > 0) {
      const auto s = static_cast<std::int64_t>(rng() % kSequences);
      trim.cache.remove_sequence(trim.live[static_cast<std::size_t>(s)]);
      db.cache.remove_sequence(db.live[static_cast<std::size_t>(s)]);
      trim.start(s);
      db.start(s);
    }
    const View<const float, 4> kv_k(k.data(), {L, H, 1, d}), kv_v(v.data(), {L, H, 1, d});
    const View<const float, 3> beta(lb.data(), {L, H, 1});
    const View<const float, 4> queries(q.data(), {L, Hq, 1, d});
    const View<float, 4> outputs(out.data(), {L, Hq, 1, d});
    evictions += trim.cache.step(trim.live[static_cast<std::size_t>(slot)], kv_k, kv_v, beta, queries, outputs).triggered;
    evictions += db.cache.step(db.live[static_cast<std::size_t>(slot)], kv_k, kv_v, beta, queries, outputs).triggered;
    for (float x : out)
      if (!std::isfinite(x)) die(step, "attention output is not finite");
    trim.check(step);
    db.check(step);
    if (step == warm) {
      heap_warm = heap_in_use();
      rss_warm = resident_bytes();
    }
    if (step > warm && step % 1000 == 0) {
      heap_max = std::max(heap_max, heap_in_use());
      rss_max = std::max(rss_max, resident_bytes());
    }
  }
  const std::int64_t heap_end = heap_in_use(), rss_end = resident_bytes();
  std::printf("soak: %lld steps, %lld evictions, %lld sequences; pool pages trimkv %lld, dbtrimkv %lld\n",
              static_cast<long long>(steps), static_cast<long long>(evictions),
              static_cast<long long>(trim.next_id + db.next_id), static_cast<long long>(trim_pages),
              static_cast<long long>(db_pages));
  std::printf("soak: heap in use %lld bytes at 10%%, %lld at the end (max %lld); resident %lld -> %lld bytes (max %lld)\n",
              static_cast<long long>(heap_warm), static_cast<long long>(heap_end), static_cast<long long>(heap_max),
              static_cast<long long>(rss_warm), static_cast<long long>(rss_end), static_cast<long long>(rss_max));
  // Slack: allocator bookkeeping may shift a little; growth per step would be far beyond these.
  if (heap_end > heap_warm + 64 * 1024) die(steps, "the heap in use grew from " + std::to_string(heap_warm) + " to " + std::to_string(heap_end));
  if (rss_end > rss_warm + 4 * 1024 * 1024) die(steps, "the resident set grew from " + std::to_string(rss_warm) + " to " + std::to_string(rss_end));
  std::printf("soak: PASSED\n");
  return 0;
}
