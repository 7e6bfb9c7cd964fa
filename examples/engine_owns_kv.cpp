// An engine that owns its paged K/V and asks a policy what to free (docs/integration.md, "Over the
// engine's own K/V"). The engine writes each token's K/V into slots of its own pool and attends over
// them; the policy's Cache (storage engine_owned) keeps only each entry's metadata and, at every
// commit, names the (layer, kv head, position) entries to drop, which the engine frees by runs.
// Checked each step: every head of the engine holds exactly the positions the policy keeps, and
// its pool, sized for M + B - 1 + the prompt per head, never runs out. The engine's attention here
// is one query of kv head 0 a layer: a stand-in for its kernel. Exit status 0 when every check holds.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include <kvpolicy/trimkv.hpp>

using namespace kvpolicy;

namespace {

const CacheShape kShape{2, 2, 4, 16};
constexpr std::int64_t kBudget = 32, kBuffer = 8, kPrompt = 40, kDecode = 200;

// The engine's K/V: per (layer, kv head) a map from position to its slot in one shared pool.
struct EnginePool {
  std::vector<float> k, v;
  std::vector<std::int64_t> free;
  std::vector<std::map<std::int32_t, std::int64_t>> slot_of;  // head_index -> position -> slot
  explicit EnginePool(std::int64_t slots)
      : k(static_cast<std::size_t>(slots * kShape.head_dim)), v(k.size()),
        slot_of(static_cast<std::size_t>(kShape.heads_total())) {
    for (std::int64_t s = slots - 1; s >= 0; --s) free.push_back(s);
  }
  void write(int l, int h, std::int32_t p, const float* key, const float* value) {
    if (free.empty()) fail("engine pool: out of slots");
    const std::int64_t s = free.back();
    free.pop_back();
    std::copy_n(key, kShape.head_dim, &k[static_cast<std::size_t>(s * kShape.head_dim)]);
    std::copy_n(value, kShape.head_dim, &v[static_cast<std::size_t>(s * kShape.head_dim)]);
    slot_of[static_cast<std::size_t>(head_index(kShape, l, h))][p] = s;
  }
  void free_run(const PositionRun& r) {  // what the policy evicted, a run of positions of one head
    auto& slots = slot_of[static_cast<std::size_t>(head_index(kShape, r.layer, r.head))];
    for (std::int32_t p = r.first; p < r.end; ++p) {
      free.push_back(slots.at(p));
      slots.erase(p);
    }
  }
  // softmax(q k^T / sqrt(d)) v over the head's own slots: the engine's attention, not the policy's
  void attend(int l, int h, const float* q, float* out) const {
    const auto& slots = slot_of[static_cast<std::size_t>(head_index(kShape, l, h))];
    const int d = kShape.head_dim;
    std::vector<double> w;
    double mx = -INFINITY, sum = 0.0;
    for (const auto& [p, s] : slots) {
      double dot = 0.0;
      for (int c = 0; c < d; ++c) dot += double{q[c]} * k[static_cast<std::size_t>(s * d + c)];
      w.push_back(dot / std::sqrt(double(d)));
      mx = std::max(mx, w.back());
    }
    for (double& x : w) sum += (x = std::exp(x - mx));
    std::fill_n(out, d, 0.0f);
    std::size_t j = 0;
    for (const auto& [p, s] : slots) {
      const double a = w[j++] / sum;
      for (int c = 0; c < d; ++c) out[c] += static_cast<float>(a * v[static_cast<std::size_t>(s * d + c)]);
    }
  }
};

}  // namespace

int run() {
  const int L = kShape.layers, H = kShape.kv_heads, d = kShape.head_dim;
  const std::int64_t per_head = kBudget + kBuffer - 1 + kPrompt;  // the most a head holds, before a commit
  EnginePool engine(per_head * kShape.heads_total());
  TrimKVCache<cpu_backend, engine_owned> policy(
      kShape, memory::Paged<16, engine_owned>(memory::Paged<16>::pages_for(kShape, per_head)),
      trimkv_evictor({.budget = kBudget, .buffer = kBuffer, .sinks = 4}));
  policy.add_sequence(0, kPrompt);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  std::vector<EvictedEntry> evicted;
  for (std::int64_t n = 0; n < kPrompt + kDecode;) {
    const std::int64_t T = n == 0 ? kPrompt : 1;
    std::vector<float> k(static_cast<std::size_t>(H * T * d)), v(k.size()), q(static_cast<std::size_t>(d)),
        out(q.size()), lb(static_cast<std::size_t>(H * T));
    for (int l = 0; l < L; ++l) {  // one layer of the engine's forward pass
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      for (float& x : lb) x = -std::abs(normal(rng));  // log beta from the engine's retention gate
      for (int h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < T; ++t)
          engine.write(l, h, static_cast<std::int32_t>(n + t), &k[static_cast<std::size_t>((h * T + t) * d)],
                       &v[static_cast<std::size_t>((h * T + t) * d)]);
      policy.append(0, l, View<const float, 3>(k.data(), {H, T, d}), {}, View<const float, 2>(lb.data(), {H, T}));
      for (float& x : q) x = normal(rng);
      engine.attend(l, 0, q.data(), out.data());  // the engine's own kernel over its own slots
    }
    evicted.clear();
    policy.commit(0, &evicted);
    for (const PositionRun& r : head_runs(evicted)) engine.free_run(r);
    n += T;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {  // the engine holds exactly what the policy keeps
        const auto& slots = engine.slot_of[static_cast<std::size_t>(head_index(kShape, l, h))];
        if (static_cast<std::int64_t>(slots.size()) != policy.length(0, l, h)) fail("head (", l, ", ", h, ") differs");
        for (std::int64_t i = 0; i < policy.length(0, l, h); ++i)
          if (!slots.contains(policy.entry(0, l, h, i).position)) fail("position not in the engine's pool");
      }
  }
  std::printf("engine_owns_kv: %lld tokens, every head holds %lld entries, policy state %lld bytes, engine K/V %lld bytes\n",
              static_cast<long long>(kPrompt + kDecode), static_cast<long long>(policy.length(0, 0, 0)),
              static_cast<long long>(memory::Paged<16, engine_owned>::bytes_for(kShape, memory::Paged<16>::pages_for(kShape, per_head))),
              static_cast<long long>(engine.k.size() * 2 * sizeof(float)));
  return 0;
}

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_owns_kv: %s\n", e.what());
    return 1;
  }
}
