// A vLLM-style engine on kvpolicy (docs/integration.md, part a): the engine owns one page pool for
// every request, admits a request only when the pool has the pages its prompt and budget need,
// prefills it in one chunk, then decodes all running requests together each iteration with
// step_batch (one validation of the whole batch, then append -> attend -> trigger/evict per
// sequence). The engine's own attention kernel reads the block tables the cache exposes; here it
// is kvpolicy's CPU paged kernel, and its output must equal what the cache computed. Finished
// requests give their pages back and waiting ones take them. Exit status 0 when every check holds.
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
  // The pool: room for 3 requests at their steady state (M + B - 1 entries per head) plus a prompt.
  const std::int64_t per_request = pages_for(kShape, kBudget + kBuffer, 1, kPage);
  const std::int64_t pool_pages = 3 * per_request + pages_for(kShape, 200, 1, kPage);
  TrimKVCache<cpu_backend, float, kPage> cache(kShape, memory::Paged<kPage>(pool_pages),
                                               trimkv_evictor({kBudget, kBuffer}));
  std::mt19937_64 rng(1);
  std::deque<Request> waiting;
  for (std::int64_t i = 0; i < 8; ++i) waiting.push_back({i, 40 + 20 * i, 150 + 10 * i});
  std::vector<Request> running;
  std::int64_t iterations = 0, finished = 0, tokens = 0;

  while (!waiting.empty() || !running.empty()) {
    // Admission: a request starts when its prompt fits now and the running set's budget still fits.
    while (!waiting.empty() && static_cast<std::int64_t>(running.size()) < 3) {
      Request r = waiting.front();
      cache.add_sequence(r.id);
      if (!cache.allocator().can_append(r.id, r.prompt)) {
        cache.remove_sequence(r.id);
        break;
      }
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

  // The block-table view an engine kernel consumes: attend one query over a fresh sequence's head
  // through memory::HeadLayout and compare with the cache's own attention.
  cache.add_sequence(100);
  Tensors t(5, rng);
  cache.step(t.step(100));
  const auto head = cache.allocator().layout(100, 0, 0);
  std::vector<float> mine(static_cast<std::size_t>(kShape.q_heads * 5 * kShape.head_dim), std::nanf(""));
  const std::vector<std::int32_t> q_pos{0, 1, 2, 3, 4};
  cpu::attend_paged(cache.allocator().pool(), head, 0, kShape.group(),
                    View<const float, 3>(t.q.data(), {kShape.q_heads, 5, kShape.head_dim}), q_pos,
                    View<float, 3>(mine.data(), {kShape.q_heads, 5, kShape.head_dim}));
  for (std::int64_t i = 0; i < kShape.group() * 5 * kShape.head_dim; ++i)  // query heads of kv head 0
    if (std::abs(mine[static_cast<std::size_t>(i)] - t.out[static_cast<std::size_t>(i)]) > 1e-6f)
      return fail("the block-table kernel disagrees with the cache's attention");
  std::printf("engine_paged: %lld requests, %lld decode iterations, %lld tokens, pool %lld pages, all returned\n",
              static_cast<long long>(finished), static_cast<long long>(iterations), static_cast<long long>(tokens),
              static_cast<long long>(pool_pages));
  return 0;
}
