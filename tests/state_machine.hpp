// The cache API as a state machine: random streams of operations (sequences added and removed,
// decode tokens and prefill chunks through step(), step_batch() and the layer API, attention,
// aborted steps), interleaved with invalid calls (wrong shapes, unknown sequences or layers,
// NaN/inf/positive log_beta, non-finite K/V/queries, out-of-pool appends, calls out of order). After
// every operation the cache must equal a simple executable model: the survivors of every head
// (position, log_beta, K, V), each sequence's token count, and the page accounting. A rejected call
// must leave the cache byte for byte as it was.
//
// One driver for every Backend: test_state_machine.cpp runs it on the CPU Cache,
// tests/cuda/test_state_machine.cu on Cache<cuda_backend> (a Profile each: the page sizes and
// head widths a backend has kernels for). It reads a cache only through the API both share
// (head_contents, tokens, pages_free; snapshot.hpp).
//
// On failure the stream's seed is printed; KVPOLICY_STREAM_SEED=<seed> replays that one stream.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/trimkv.hpp"
#include "oracle.hpp"
#include "snapshot.hpp"

namespace state_machine {

using namespace kvpolicy;


// What the streams exercised, reported per test case so a generator that stopped reaching a
// state shows up in the log.
struct Coverage {
  std::int64_t accepted = 0, rejected = 0, evictions = 0, evicted = 0;
};
inline Coverage coverage;

// What a backend's cache can take: its page size and head widths (the device's kernels exist for
// pages of 16-64 and heads of 64-256), how close its attention is to the model's double, and how
// many operations a stream makes.
struct Profile {
  int page = 4;
  std::vector<int> head_dims{1, 2, 3, 4};
  double attention_tolerance = 1e-4;
  int operations = 120;
};
constexpr std::int64_t kIds = 4;  // sequence ids 0..3 (some unknown at any time)

enum class Policy { per_head, global, layer_wise };

// ---- the model ---------------------------------------------------------------------------------
struct Entry {
  std::int32_t position;
  float log_beta;
  std::vector<float> k, v;
};

struct Sequence {
  std::int64_t n = 0, pending = 0;
  std::vector<std::uint8_t> appended;
  std::vector<std::vector<Entry>> heads;  // [L * Hkv]
};

struct Model {
  CacheShape shape;
  Policy policy;
  oracle::Params params;
  int horizon = 1;
  int page = 4;
  std::int64_t pages_total = 0;
  std::map<std::int64_t, Sequence> seqs;

  std::int64_t pages_for(std::size_t len) const { return (static_cast<std::int64_t>(len) + page - 1) / page; }
  std::int64_t pages_used() const {
    std::int64_t used = 0;
    for (const auto& [id, s] : seqs)
      for (const auto& h : s.heads) used += pages_for(h.size());
    return used;
  }
  std::int64_t pages_free() const { return pages_total - pages_used(); }
  std::int64_t pages_needed(const Sequence& s, std::int64_t T, int layer = -1) const {
    std::int64_t need = 0;
    for (int l = 0; l < shape.layers; ++l) {
      if (layer >= 0 && l != layer) continue;
      for (int h = 0; h < shape.kv_heads; ++h) {
        const auto len = s.heads[static_cast<std::size_t>(head_index(shape, l, h))].size();
        need += pages_for(len + static_cast<std::size_t>(T)) - pages_for(len);
      }
    }
    return need;
  }

  void add(std::int64_t id) {
    Sequence s;
    s.appended.assign(static_cast<std::size_t>(shape.layers), 0);
    s.heads.resize(static_cast<std::size_t>(shape.heads_total()));
    seqs.emplace(id, std::move(s));
  }

  // SPEC §1–2 by the brute-force oracle, then the survivors' K/V carried along by position.
  void evict(Sequence& s) const {
    oracle::Heads heads(s.heads.size());
    for (std::size_t i = 0; i < s.heads.size(); ++i)
      for (const auto& e : s.heads[i]) heads[i].push_back(EntryMeta{e.position, e.log_beta, 0.0f});
    switch (policy) {
      case Policy::per_head: oracle::per_head(shape, heads, s.n, score::RetentionDecay{}, params); break;
      case Policy::global: oracle::global(shape, heads, s.n, score::Lookahead{horizon}, params); break;
      case Policy::layer_wise: oracle::layer_wise(shape, heads, s.n, score::Lookahead{horizon}, params); break;
    }
    std::int64_t before = 0, after = 0;
    for (std::size_t i = 0; i < s.heads.size(); ++i) {
      before += static_cast<std::int64_t>(s.heads[i].size());
      after += static_cast<std::int64_t>(heads[i].size());
    }
    coverage.evictions += before != after;
    coverage.evicted += before - after;
    for (std::size_t i = 0; i < s.heads.size(); ++i) {
      std::vector<Entry> kept;
      for (const auto& e : s.heads[i])
        if (std::any_of(heads[i].begin(), heads[i].end(), [&](const EntryMeta& m) { return m.position == e.position; }))
          kept.push_back(e);
      s.heads[i] = std::move(kept);
    }
  }
};

// ---- inputs ------------------------------------------------------------------------------------
// Ways a call is made invalid; `none` is a valid call (if the model's state allows it).
enum class Fault { none, nan_log_beta, positive_log_beta, inf_key, nan_value, nan_query, wrong_head_dim, wrong_tokens };
constexpr int kFaults = 8;

struct StepData {
  std::int64_t T = 1;
  std::vector<float> k, v, lb, q, out;
};

inline StepData make_step(std::mt19937_64& rng, const CacheShape& s, std::int64_t T, int layers) {
  std::normal_distribution<float> normal;
  StepData d;
  d.T = T;
  d.k.resize(static_cast<std::size_t>(layers * s.kv_heads * T * s.head_dim));
  d.v.resize(d.k.size());
  for (auto& x : d.k) x = normal(rng);
  for (auto& x : d.v) x = normal(rng);
  d.lb.resize(static_cast<std::size_t>(layers * s.kv_heads * T));
  for (auto& x : d.lb) x = oracle::tie_prone_log_beta(rng);
  d.q.resize(static_cast<std::size_t>(layers * s.q_heads * T * s.head_dim));
  for (auto& x : d.q) x = normal(rng);
  d.out.assign(d.q.size(), std::nanf(""));
  return d;
}

// Corrupts one value of the step (the shape faults are applied to the views instead).
inline void corrupt(std::mt19937_64& rng, StepData& d, Fault f) {
  auto pick = [&](std::vector<float>& v) -> float& {
    return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
  };
  switch (f) {
    case Fault::nan_log_beta: pick(d.lb) = std::nanf(""); break;
    case Fault::positive_log_beta:
      pick(d.lb) = std::uniform_int_distribution<int>(0, 1)(rng) ? 0.5f : std::numeric_limits<float>::infinity();
      break;
    case Fault::inf_key: pick(d.k) = std::numeric_limits<float>::infinity(); break;
    case Fault::nan_value: pick(d.v) = std::nanf(""); break;
    case Fault::nan_query: pick(d.q) = std::nanf(""); break;
    default: break;
  }
}

// Attention of the step's queries over the model's head contents (causal: the query at position
// n + t sees positions <= n + t), naively in double.
inline void expect_attention(const Model& m, const Sequence& s, int layer, const float* q, const float* out, std::int64_t T,
                             double tolerance) {
  const auto& sh = m.shape;
  const int d = sh.head_dim, G = sh.group();
  for (int qh = 0; qh < sh.q_heads; ++qh) {
    const auto& head = s.heads[static_cast<std::size_t>(head_index(sh, layer, qh / G))];
    for (std::int64_t t = 0; t < T; ++t) {
      const float* qv = q + (qh * T + t) * d;
      const float* ov = out + (qh * T + t) * d;
      double mx = -std::numeric_limits<double>::infinity();
      std::vector<double> w;
      for (const auto& e : head) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(qv[c]) * e.k[static_cast<std::size_t>(c)];
        w.push_back(e.position <= s.n + t ? dot / std::sqrt(double(d)) : -std::numeric_limits<double>::infinity());
        mx = std::max(mx, w.back());
      }
      double den = 0;
      for (auto& x : w) den += (x = std::exp(x - mx));
      for (int c = 0; c < d; ++c) {
        double want = 0;
        for (std::size_t i = 0; i < head.size(); ++i) want += w[i] / den * head[i].v[static_cast<std::size_t>(c)];
        REQUIRE(std::abs(ov[c] - want) <= tolerance * (1.0 + std::abs(want)));
      }
    }
  }
}

// ---- the cache against the model ----------------------------------------------------------------
template <class C>
void expect_equal(const C& cache, const Model& m) {
  const auto& sh = m.shape;
  for (std::int64_t id = 0; id < kIds; ++id) {
    const auto it = m.seqs.find(id);
    REQUIRE(cache.has_sequence(id) == (it != m.seqs.end()));
    if (it == m.seqs.end()) continue;
    const Sequence& s = it->second;
    REQUIRE(cache.tokens(id) == s.n);
    for (int l = 0; l < sh.layers; ++l)
      for (int h = 0; h < sh.kv_heads; ++h) {
        auto want = s.heads[static_cast<std::size_t>(head_index(sh, l, h))];
        const HeadContents head = cache.head_contents(id, l, h);  // storage order
        REQUIRE(static_cast<std::int64_t>(head.meta.size()) == static_cast<std::int64_t>(want.size()));
        if constexpr (requires { cache.allocator().layout(id, l, h); })  // the pages the head takes
          REQUIRE(static_cast<std::int64_t>(cache.allocator().layout(id, l, h).block_table.size()) ==
                  m.pages_for(want.size()));
        std::vector<Entry> got;
        const auto d = static_cast<std::size_t>(sh.head_dim);
        for (std::size_t i = 0; i < head.meta.size(); ++i)
          got.push_back({head.meta[i].position, head.meta[i].write_score,
                         std::vector<float>(head.keys.begin() + i * d, head.keys.begin() + (i + 1) * d),
                         std::vector<float>(head.values.begin() + i * d, head.values.begin() + (i + 1) * d)});
        auto by_pos = [](const Entry& a, const Entry& b) { return a.position < b.position; };
        std::sort(got.begin(), got.end(), by_pos);
        std::sort(want.begin(), want.end(), by_pos);
        for (std::size_t i = 0; i < want.size(); ++i) {
          REQUIRE(got[i].position == want[i].position);
          // log_beta compared as bits: -inf and 0 are both common here
          REQUIRE(std::memcmp(&got[i].log_beta, &want[i].log_beta, sizeof(float)) == 0);
          REQUIRE(got[i].k == want[i].k);
          REQUIRE(got[i].v == want[i].v);
        }
      }
  }
  REQUIRE(cache.pages_free() == m.pages_free());
  REQUIRE(cache.pages_total() == m.pages_total);
}

inline std::vector<std::int64_t> all_ids() {
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < kIds; ++i) ids.push_back(i);
  return ids;
}

// One random stream. `make` builds the cache for the drawn parameters.
template <class C, class Make>
void run_stream(std::uint64_t seed, Policy policy, const Profile& profile, Make make) {
  std::mt19937_64 rng(seed);
  auto uni = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  Model m;
  m.policy = policy;
  m.page = profile.page;
  const auto head_dims = static_cast<std::int64_t>(profile.head_dims.size());
  m.shape = CacheShape{static_cast<int>(uni(1, 2)), static_cast<int>(uni(1, 2)), 0,
                       profile.head_dims[static_cast<std::size_t>(uni(0, head_dims - 1))]};
  m.shape.q_heads = m.shape.kv_heads * static_cast<int>(uni(1, 2));
  m.params.budget = uni(1, 5);
  m.params.buffer = uni(1, 3);
  m.params.window = uni(0, 3) == 0 ? std::min<std::int64_t>(uni(1, 2), m.params.budget) : 0;  // w <= M
  m.params.floor_ratio = policy != Policy::per_head && uni(0, 3) == 0 ? 0.5 : 0.0;
  m.params.threshold = m.params.floor_ratio == 0.0 && uni(0, 5) == 0 ? 0.4 : 0.0;  // exclusive variants
  m.params.min_tokens = m.params.threshold > 0.0 && uni(0, 1) == 0 ? uni(1, 3) : 0;  // the threshold's floor
  m.horizon = static_cast<int>(uni(1, 3));
  m.pages_total = uni(2, 48);
  C cache = make(m);
  const auto& sh = m.shape;
  const auto ids = all_ids();

  std::ostringstream log;
  INFO("stream seed ", seed, " (replay: KVPOLICY_STREAM_SEED=", seed, "); operations so far:\n", log.str());
  auto rejected = [&](auto&& call, const char* what) {
    const auto before = testing::snapshot(cache, ids);
    log << "  rejected " << what << "\n";
    ++coverage.rejected;
    REQUIRE_THROWS_AS(call(), kvpolicy::Error);
    REQUIRE(testing::snapshot(cache, ids) == before);
  };

  for (int op = 0; op < profile.operations; ++op) {
    // mostly a known sequence, sometimes any id (unknown ones are refused)
    std::int64_t id = uni(0, kIds - 1);
    if (!m.seqs.empty() && uni(0, 3) != 0) id = std::next(m.seqs.begin(), uni(0, static_cast<std::int64_t>(m.seqs.size()) - 1))->first;
    const auto it = m.seqs.find(id);
    const bool known = it != m.seqs.end();
    Sequence* s = known ? &it->second : nullptr;
    const Fault fault = uni(0, 5) == 0 ? static_cast<Fault>(uni(1, kFaults - 1)) : Fault::none;
    const std::int64_t T = uni(0, 3) == 0 ? uni(2, 10) : 1;  // a prefill chunk or a decode token
    const std::int64_t L = sh.layers, H = sh.kv_heads, Hq = sh.q_heads, D = sh.head_dim;
    const std::int64_t Dv = fault == Fault::wrong_head_dim ? D + 1 : D;  // a view of the wrong width
    const std::int64_t Tv = fault == Fault::wrong_tokens ? T + 1 : T;    // values of the wrong length
    int kind = static_cast<int>(uni(0, 9));
    if (known && s->pending > 0 && uni(0, 4) != 0) kind = static_cast<int>(uni(6, 9));  // mostly finish an open step
    if (known && m.pages_free() < 4 && uni(0, 3) == 0) kind = 1;                      // a full pool frees a sequence
    log << "op " << op << ": kind " << kind << " seq " << id << " T " << T << " fault " << static_cast<int>(fault);
    log << (known ? "" : " (unknown)") << "\n";

    if (kind == 0) {  // add_sequence
      if (known) {
        rejected([&] { cache.add_sequence(id); }, "add_sequence of a known id");
      } else {
        cache.add_sequence(id);
        m.add(id);
      }
    } else if (kind == 1) {  // remove_sequence
      if (!known) {
        rejected([&] { cache.remove_sequence(id); }, "remove_sequence of an unknown id");
      } else {
        cache.remove_sequence(id);
        m.seqs.erase(id);
      }
    } else if (kind <= 4) {  // step(): the whole forward step of one sequence
      StepData d = make_step(rng, sh, T, sh.layers);
      corrupt(rng, d, fault);
      d.k.resize(static_cast<std::size_t>(L * H * T * Dv), 0.5f);
      d.v.resize(static_cast<std::size_t>(L * H * Tv * D), 0.5f);
      const bool attend = uni(0, 1) == 0;  // a NaN query is refused only when there is attention
      auto call = [&] {
        return cache.step(id, View<const float, 4>(d.k.data(), {L, H, T, Dv}), View<const float, 4>(d.v.data(), {L, H, Tv, D}),
                          View<const float, 3>(d.lb.data(), {L, H, T}),
                          attend ? View<const float, 4>(d.q.data(), {L, Hq, T, D}) : View<const float, 4>{},
                          attend ? View<float, 4>(d.out.data(), {L, Hq, T, D}) : View<float, 4>{});
      };
      const bool ok = known && s->pending == 0 && (fault == Fault::none || (fault == Fault::nan_query && !attend)) &&
                      m.pages_needed(*s, T) <= m.pages_free();
      if (!ok) {
        rejected(call, "step");
        continue;
      }
      call();
      for (int l = 0; l < sh.layers; ++l)
        for (int h = 0; h < sh.kv_heads; ++h)
          for (std::int64_t t = 0; t < T; ++t) {
            const std::size_t row = static_cast<std::size_t>(((l * H + h) * T + t) * D);
            s->heads[static_cast<std::size_t>(head_index(sh, l, h))].push_back(
                {static_cast<std::int32_t>(s->n + t), d.lb[static_cast<std::size_t>((l * H + h) * T + t)],
                 std::vector<float>(d.k.begin() + row, d.k.begin() + row + D),
                 std::vector<float>(d.v.begin() + row, d.v.begin() + row + D)});
          }
      if (attend)
        for (int l = 0; l < sh.layers; ++l)
          expect_attention(m, *s, l, d.q.data() + l * Hq * T * D, d.out.data() + l * Hq * T * D, T,
                           profile.attention_tolerance);
      s->n += T;
      m.evict(*s);
    } else if (kind == 5) {  // step_batch over two ids (maybe the same one twice, maybe unknown)
      const std::int64_t id2 = uni(0, kIds - 1);
      StepData d1 = make_step(rng, sh, T, sh.layers), d2 = make_step(rng, sh, 1, sh.layers);
      corrupt(rng, d2, fault == Fault::nan_query ? Fault::nan_log_beta : fault);
      // the shape faults go to the second sequence's views
      d2.k.resize(static_cast<std::size_t>(L * H * Dv), 0.5f);
      d2.v.resize(static_cast<std::size_t>(L * H * (fault == Fault::wrong_tokens ? 2 : 1) * D), 0.5f);
      using Step = typename C::SequenceStep;
      const Step batch[2] = {
          Step{id, View<const float, 4>(d1.k.data(), {L, H, T, D}), View<const float, 4>(d1.v.data(), {L, H, T, D}),
               View<const float, 3>(d1.lb.data(), {L, H, T})},
          Step{id2, View<const float, 4>(d2.k.data(), {L, H, 1, Dv}),
               View<const float, 4>(d2.v.data(), {L, H, fault == Fault::wrong_tokens ? 2 : 1, D}),
               View<const float, 3>(d2.lb.data(), {L, H, 1})}};
      const auto it2 = m.seqs.find(id2);
      bool ok = known && it2 != m.seqs.end() && id2 != id && fault == Fault::none && s->pending == 0 &&
                it2->second.pending == 0;
      if (ok) ok = m.pages_needed(*s, T) + m.pages_needed(it2->second, 1) <= m.pages_free();
      if (!ok) {
        rejected([&] { cache.step_batch(batch); }, "step_batch");
        continue;
      }
      cache.step_batch(batch);
      for (auto [seq, data, TT] : {std::tuple{s, &d1, T}, std::tuple{&it2->second, &d2, std::int64_t{1}}}) {
        for (int l = 0; l < sh.layers; ++l)
          for (int h = 0; h < sh.kv_heads; ++h)
            for (std::int64_t t = 0; t < TT; ++t) {
              const std::size_t row = static_cast<std::size_t>(((l * H + h) * TT + t) * D);
              seq->heads[static_cast<std::size_t>(head_index(sh, l, h))].push_back(
                  {static_cast<std::int32_t>(seq->n + t), data->lb[static_cast<std::size_t>((l * H + h) * TT + t)],
                   std::vector<float>(data->k.begin() + row, data->k.begin() + row + D),
                   std::vector<float>(data->v.begin() + row, data->v.begin() + row + D)});
            }
        seq->n += TT;
        m.evict(*seq);
      }
    } else if (kind <= 7) {  // layer API: append one layer (or a layer out of range)
      int layer = static_cast<int>(uni(0, 7) == 0 ? (uni(0, 1) ? -1 : sh.layers) : uni(0, sh.layers - 1));
      if (known && layer >= 0 && layer < sh.layers && uni(0, 4) != 0)  // mostly a layer still to append
        for (int l = 0; l < sh.layers; ++l)
          if (!s->appended[static_cast<std::size_t>(l)]) layer = l;
      const std::int64_t Tl = known && s->pending > 0 && uni(0, 4) != 0 ? s->pending : T;
      StepData d = make_step(rng, sh, Tl, 1);
      corrupt(rng, d, fault == Fault::nan_query ? Fault::none : fault);
      const std::int64_t Tlv = fault == Fault::wrong_tokens ? Tl + 1 : Tl;
      d.k.resize(static_cast<std::size_t>(H * Tl * Dv), 0.5f);
      d.v.resize(static_cast<std::size_t>(H * Tlv * D), 0.5f);
      auto call = [&] {
        cache.append(id, layer, View<const float, 3>(d.k.data(), {H, Tl, Dv}), View<const float, 3>(d.v.data(), {H, Tlv, D}),
                     View<const float, 2>(d.lb.data(), {H, Tl}));
      };
      const bool ok = known && layer >= 0 && layer < sh.layers && !s->appended[static_cast<std::size_t>(layer)] &&
                      (s->pending == 0 || s->pending == Tl) && (fault == Fault::none || fault == Fault::nan_query) &&
                      m.pages_needed(*s, Tl, layer) <= m.pages_free();
      if (!ok) {
        rejected(call, "append");
        continue;
      }
      call();
      for (int h = 0; h < sh.kv_heads; ++h)
        for (std::int64_t t = 0; t < Tl; ++t) {
          const std::size_t row = static_cast<std::size_t>((h * Tl + t) * D);
          s->heads[static_cast<std::size_t>(head_index(sh, layer, h))].push_back(
              {static_cast<std::int32_t>(s->n + t), d.lb[static_cast<std::size_t>(h * Tl + t)],
               std::vector<float>(d.k.begin() + row, d.k.begin() + row + D),
               std::vector<float>(d.v.begin() + row, d.v.begin() + row + D)});
        }
      s->pending = Tl;
      s->appended[static_cast<std::size_t>(layer)] = 1;
    } else if (kind == 8) {  // layer API: attend one layer (or a layer out of range)
      const int layer = static_cast<int>(uni(0, 7) == 0 ? (uni(0, 1) ? -1 : sh.layers) : uni(0, sh.layers - 1));
      const std::int64_t Tq = known && s->pending > 0 ? s->pending : T;
      StepData d = make_step(rng, sh, Tq, 1);
      if (fault == Fault::nan_query) corrupt(rng, d, fault);
      const std::int64_t Dq = fault == Fault::wrong_head_dim ? D + 1 : D;
      d.q.resize(static_cast<std::size_t>(Hq * Tq * Dq), 0.5f);
      d.out.assign(d.q.size(), std::nanf(""));
      auto call = [&] {
        cache.attend(id, layer, View<const float, 3>(d.q.data(), {Hq, Tq, Dq}), View<float, 3>(d.out.data(), {Hq, Tq, Dq}));
      };
      const bool ok = known && layer >= 0 && layer < sh.layers && s->pending > 0 &&
                      s->appended[static_cast<std::size_t>(layer)] && fault != Fault::nan_query &&
                      fault != Fault::wrong_head_dim;
      if (!ok) {
        rejected(call, "attend");
        continue;
      }
      call();
      expect_attention(m, *s, layer, d.q.data(), d.out.data(), Tq, profile.attention_tolerance);
    } else {  // layer API: commit, or abort the open step
      if (uni(0, 3) == 0) {
        if (!known) {
          rejected([&] { cache.abort_step(id); }, "abort_step of an unknown id");
          continue;
        }
        cache.abort_step(id);
        for (auto& h : s->heads)
          h.erase(std::remove_if(h.begin(), h.end(), [&](const Entry& e) { return e.position >= s->n; }), h.end());
        s->pending = 0;
        std::fill(s->appended.begin(), s->appended.end(), std::uint8_t{0});
      } else {
        const bool ok = known && s->pending > 0 &&
                        std::all_of(s->appended.begin(), s->appended.end(), [](std::uint8_t a) { return a != 0; });
        if (!ok) {
          rejected([&] { cache.commit(id); }, "commit");
          continue;
        }
        cache.commit(id);
        s->n += s->pending;
        s->pending = 0;
        std::fill(s->appended.begin(), s->appended.end(), std::uint8_t{0});
        m.evict(*s);
      }
    }
    ++coverage.accepted;
    expect_equal(cache, m);
  }
}

// Streams per policy; KVPOLICY_STREAM_SEED runs just one.
template <class C, class Make>
void run_streams(Policy policy, std::uint64_t base, int count, Make make, const Profile& profile = {}) {
  if (const char* env = std::getenv("KVPOLICY_STREAM_SEED")) {
    const std::uint64_t seed = std::strtoull(env, nullptr, 10);
    if (seed / 100000 == base / 100000) run_stream<C>(seed, policy, profile, make);
    return;
  }
  coverage = {};
  for (int i = 0; i < count; ++i) run_stream<C>(base + static_cast<std::uint64_t>(i), policy, profile, make);
  MESSAGE(count, " streams: ", coverage.accepted, " calls accepted, ", coverage.rejected, " rejected, ",
          coverage.evictions, " evictions removed ", coverage.evicted, " entries");
  CHECK(coverage.evictions > count);
  CHECK(coverage.rejected > count);
}

}  // namespace state_machine
