// A vLLM-style engine on kvpolicy (docs/integration.md, part a): the engine owns one page pool for
// every request, admits a request only when the pool has the pages its prompt and budget need,
// prefills it in one chunk, then decodes all running requests together each iteration with
// step_batch (one validation of the whole batch, then append -> attend -> trigger/evict per
// sequence). The engine's own attention kernel reads the block tables the cache exposes; here it
// is kvpolicy's CPU paged kernel, and its output must equal what the cache computed. Finished
// requests give their pages back and waiting ones take them. Exit status 0 when every check holds.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <random>
#include <vector>

#include <kvpolicy/trimkv.hpp>

using namespace kvpolicy;

namespace {

constexpr int kPage = 16;
const CacheShape kShape{4, 2, 8, 32};
constexpr std::int64_t kBudget = 64, kBuffer = 16;

struct Request {
  std::int64_t id, prompt, max_new, generated = 0;
};

// The model's per-step tensors for one sequence: K/V [L, Hkv, T, d], log_beta [L, Hkv, T],
// queries/out [L, Hq, T, d]. A real engine gets them from its layers and its retention gate.
struct Tensors {
  std::int64_t T;
  std::vector<float> k, v, lb, q, out;
  Tensors(std::int64_t tokens, std::mt19937_64& rng) : T(tokens) {
    const auto L = kShape.layers, H = kShape.kv_heads, Hq = kShape.q_heads, d = kShape.head_dim;
    std::normal_distribution<float> normal;
    k.resize(static_cast<std::size_t>(L * H * T * d));
    v.resize(k.size());
    q.resize(static_cast<std::size_t>(L * Hq * T * d));
    out.assign(q.size(), std::nanf(""));
    lb.resize(static_cast<std::size_t>(L * H * T));
    for (auto* x : {&k, &v, &q})
      for (auto& e : *x) e = normal(rng);
    for (auto& e : lb) e = -std::abs(normal(rng)) * 0.05f;
  }
  Cache<score::RetentionDecay, admit::All, evict::PerHead<trigger::Buffered>, memory::Paged<kPage>,
        cpu_backend>::SequenceStep step(std::int64_t seq) {
    const std::int64_t L = kShape.layers, H = kShape.kv_heads, Hq = kShape.q_heads, d = kShape.head_dim;
    return {seq, View<const float, 4>(k.data(), {L, H, T, d}), View<const float, 4>(v.data(), {L, H, T, d}),
            View<const float, 3>(lb.data(), {L, H, T}), View<const float, 4>(q.data(), {L, Hq, T, d}),
            View<float, 4>(out.data(), {L, Hq, T, d})};
  }
};

int fail(const char* what) {
  std::fprintf(stderr, "engine_paged: %s\n", what);
  return 1;
}

}  // namespace

int main() {
  // The pool: room for 3 requests at their peak (M + B entries per head during a step) plus a prompt.
  const std::int64_t per_request = pages_for(kShape, kBudget + kBuffer, 1, kPage);
  const std::int64_t pool_pages = 3 * per_request + pages_for(kShape, 200, 1, kPage);
  TrimKVCache<cpu_backend, float, kPage> cache(kShape, memory::Paged<kPage>(pool_pages),
                                               trimkv_evictor({.budget = kBudget, .buffer = kBuffer}));
  std::mt19937_64 rng(1);
  std::deque<Request> waiting;
  for (std::int64_t i = 0; i < 8; ++i) waiting.push_back({i, 40 + 20 * i, 150 + 10 * i});
  std::vector<Request> running;
  std::int64_t iterations = 0, finished = 0, tokens = 0;

  while (!waiting.empty() || !running.empty()) {
    // Admission: a request starts when its prompt fits in what is free after reserving, for every
    // running request, the pages it may still grow into (up to M + B entries per head during a
    // step). Decode can then never run out of pages.
    while (!waiting.empty()) {
      Request r = waiting.front();
      std::int64_t reserve = 0;
      for (const auto& run : running) reserve += per_request - cache.allocator().pages_used(run.id);
      const std::int64_t prompt_pages = pages_for(kShape, std::max(r.prompt, kBudget + kBuffer), 1, kPage);
      if (cache.allocator().pages_free() - reserve < prompt_pages) break;
      cache.add_sequence(r.id);
      waiting.pop_front();
      Tensors prefill(r.prompt, rng);
      cache.step(prefill.step(r.id));  // chunked prefill: causal inside the chunk, then evict
      running.push_back(r);
    }
    // One decode iteration for every running request, as one batch.
    std::vector<Tensors> batch_tensors;
    batch_tensors.reserve(running.size());
    std::vector<decltype(std::declval<Tensors&>().step(0))> batch;
    for (const auto& r : running) {
      batch_tensors.emplace_back(1, rng);
      batch.push_back(batch_tensors.back().step(r.id));
    }
    cache.step_batch(batch);
    ++iterations;
    tokens += static_cast<std::int64_t>(running.size());

    // Per request: the budget holds (SPEC §1: at most M + B - 1 entries per head after a step) and
    // attention wrote every output.
    for (std::size_t i = 0; i < running.size(); ++i) {
      auto& r = running[i];
      ++r.generated;
      for (int l = 0; l < kShape.layers; ++l)
        for (int h = 0; h < kShape.kv_heads; ++h)
          if (cache.length(r.id, l, h) > kBudget + kBuffer - 1) return fail("a head exceeds M + B - 1 entries");
      for (float x : batch_tensors[i].out)
        if (!std::isfinite(x)) return fail("attention output not written");
    }
    // A request that is done frees its pages for the waiting ones.
    for (auto it = running.begin(); it != running.end();) {
      if (it->generated == it->max_new) {
        cache.remove_sequence(it->id);
        ++finished;
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    if (cache.allocator().pages_free() > pool_pages) return fail("page accounting");
  }
  if (finished != 8 || cache.allocator().pages_free() != pool_pages) return fail("not every request finished cleanly");

  // The block-table view an engine kernel consumes, on a sequence that has been through eviction
  // (its survivors are scattered over its pages): the paged kernel over memory::HeadLayout must
  // equal dense attention over the survivors gathered from the same layout.
  cache.add_sequence(100);
  for (int step = 0; step < 3 * (kBudget + kBuffer); ++step) {
    Tensors t(1, rng);
    cache.step(t.step(100));
  }
  const int d = kShape.head_dim, G = kShape.group();
  const auto head = cache.allocator().layout(100, 1, 1);
  const auto& pool = cache.allocator().pool();
  std::vector<float> keys, values;
  std::vector<std::int32_t> key_pos;
  for (std::int64_t i = 0; i < head.length; ++i) {
    key_pos.push_back(pool.meta(head.slot(i)).position);
    keys.insert(keys.end(), pool.key(head.slot(i)), pool.key(head.slot(i)) + d);
    values.insert(values.end(), pool.value(head.slot(i)), pool.value(head.slot(i)) + d);
  }
  Tensors probe(1, rng);  // queries [Hq, 1, d] for layer 0's slots, reused for this head's group
  std::vector<float> mine(probe.q.size(), std::nanf("")), dense(static_cast<std::size_t>(d), std::nanf(""));
  const std::vector<std::int32_t> q_pos{static_cast<std::int32_t>(cache.tokens(100))};
  cpu::attend_paged(pool, head, 1, G, View<const float, 3>(probe.q.data(), {kShape.q_heads, 1, d}), q_pos,
                    View<float, 3>(mine.data(), {kShape.q_heads, 1, d}));
  for (int g = 0; g < G; ++g) {
    const int qh = 1 * G + g;  // the query heads of kv head 1
    cpu::attend_dense(View<const float, 2>(probe.q.data() + qh * d, {1, d}), View<const float, 2>(keys.data(), {head.length, d}),
                      View<const float, 2>(values.data(), {head.length, d}), key_pos, q_pos,
                      View<float, 2>(dense.data(), {1, d}));
    for (int c = 0; c < d; ++c)
      if (!(std::abs(mine[static_cast<std::size_t>(qh * d + c)] - dense[static_cast<std::size_t>(c)]) <= 1e-5f))
        return fail("the block-table kernel disagrees with dense attention over the survivors");
  }
  if (head.length > kBudget + kBuffer - 1 || head.length < kBudget) return fail("the probed head is not at its budget");
  std::printf("engine_paged: %lld requests, %lld decode iterations, %lld tokens, pool %lld pages, all returned\n",
              static_cast<long long>(finished), static_cast<long long>(iterations), static_cast<long long>(tokens),
              static_cast<long long>(pool_pages));
  return 0;
}
