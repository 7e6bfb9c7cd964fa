// The API state machine (test_state_machine.cpp) for every registered policy (registry.hpp: a
// policy added tomorrow runs here with no edit, its options drawn small and at random), for WG-KV's
// appendix-K budget with the settings its registry entry fixes drawn too, and for the WG-KV +
// TRIM-KV composition, which no registry entry names.
//
// Their semantics are checked against brute-force oracles in their own test files; what this file
// checks is the API around them. A cache under test takes random streams of operations: sequences
// added (prompt declared or not) and removed; steps through step(), step_batch() and the layer API
// (append in any layer order, attend, commit), steps taken back by abort_step(); and invalid calls
// mixed in (NaN or refused metadata, a gate argument outside [0, 1] or missing where the Admitter
// reads it, non-finite K/V/queries, wrong shapes or token counts, an invalid prompt length, unknown
// sequences or layers, calls out of order, appends the pool cannot hold). A second cache of the
// same policy, the reference, takes only each committed step, whole, through step(): this checks
// that every path through the API is the same step (the policies' rules themselves are checked
// against brute-force oracles in their own tests).
// After every call:
//   - a refused call left the cache under test byte for byte as it was (SPEC §7), and an accepted
//     one was valid: validity is predicted from the call alone and the pool's free pages;
//   - every sequence with no open step holds what the reference holds: token and prompt counts,
//     and per head the entries in storage order (position, every metadata field including H2O's
//     attention mass and WG-KV's gate, K and V, bit for bit) and the pages they take;
//   - the commit's report and evicted list, and every attention output, equal the reference's bit
//     for bit — so the layer API, step_batch and a step taken back change nothing the policy sees
//     (H2O's mass, SnapKV's and appendix K's query windows, WG-KV's ring);
//   - pages are conserved.
//
// On failure the stream's seed is printed; KVPOLICY_STREAM_SEED=<seed> replays that one stream.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kvpolicy/baselines.hpp"
#include "kvpolicy/epikv.hpp"
#include "kvpolicy/registry.hpp"
#include "kvpolicy/trimkv.hpp"
#include "kvpolicy/wgkv.hpp"
#include "oracle.hpp"
#include "snapshot.hpp"
#include "trials.hpp"

using namespace kvpolicy;

namespace {

constexpr int kPage = 4;
constexpr std::int64_t kIds = 4;  // sequence ids 0..3 (some unknown at any time)
using Rng = std::mt19937_64;
using Pool = memory::Paged<kPage, float>;

std::int64_t uni(Rng& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}
float pick(Rng& rng, std::initializer_list<float> values) {
  return *(values.begin() + uni(rng, 0, static_cast<std::int64_t>(values.size()) - 1));
}
constexpr float kInf = std::numeric_limits<float>::infinity();

// What the streams exercised, reported per test case so a generator that stopped reaching a state
// shows up in the log.
struct Coverage {
  std::int64_t accepted = 0, rejected = 0, committed = 0, evictions = 0, evicted = 0, aborted = 0;
  std::int64_t fault_refused = 0;      // refused for the injected fault alone
  std::int64_t aborted_attended = 0;   // aborts of a step that had attended (H2O's mass, the windows)
  std::int64_t layer_commits = 0, batch_commits = 0;
  std::int64_t probes = 0;             // probe steps opened (SPEC §10), where the Cache takes them
};
Coverage coverage;

// ---- the policies ---------------------------------------------------------------------------------
// Each: the cache type C; make() draws a configuration; meta() draws a value of the per-token
// write score (log_beta, a frozen score or WG-KV's g) full of ties; bad_meta is a value append
// refuses besides NaN; `observes`: steps must attend (the policy ranks by attention); `gated`: the
// Admitter reads append's gate, which is then required; `prompt`: add_sequence declares a prompt
// length now and then.
struct LogBetaMeta {
  static float meta(Rng& rng) { return oracle::tie_prone_log_beta(rng); }
  static constexpr float bad_meta = 0.5f;  // log_beta > 0
};
struct FrozenMeta {  // SPEC §4: finite or -inf
  static float meta(Rng& rng) { return pick(rng, {-kInf, -1.0f, 0.0f, 0.0f, 0.5f, 2.0f, 1e30f}); }
  static constexpr float bad_meta = kInf;
};
struct GateMeta {  // SPEC §3: g in [0, 1], ties at tau
  static float meta(Rng& rng) { return pick(rng, {0.0f, 0.05f, 0.1f, 0.1f, 0.5f, 0.5f, 1.0f}); }
  static constexpr float bad_meta = kInf;
};

// WG-KV's appendix-K budget with what its registry entry fixes (the fraction, the pooling kernel and
// the observation window) drawn too.
struct WGKVBudget : GateMeta {
  static constexpr const char* name = "WG-KV with the appendix-K budget";
  using C = WGKVBudgetCache<cpu_backend, float, kPage>;
  static constexpr bool observes = true, gated = false, prompt = false;
  static C make(Rng& rng, const CacheShape& s, std::int64_t pages) {
    WGKVBudgetConfig c;
    c.local = uni(rng, 1, 3);
    c.tau = uni(rng, 0, 1) ? 0.1 : 0.5;
    c.average_budget = uni(rng, 1, 3);
    c.observation_window = uni(rng, 1, 4);
    c.pool_kernel = static_cast<int>(pick(rng, {1.0f, 3.0f, 5.0f}));
    c.fraction = uni(rng, 0, 1) ? 0.1 : 0.5;
    return C(s, Pool(pages), wgkv_budget_evictor(s, c), wgkv_budget_scorer(s, c));
  }
};
struct WGKVRetention : LogBetaMeta {
  static constexpr const char* name = "WG-KV admission + TRIM-KV retention eviction";
  using C = WGKVRetentionCache<cpu_backend, float, kPage>;
  static constexpr bool observes = false, gated = true, prompt = false;
  static C make(Rng& rng, const CacheShape& s, std::int64_t pages) {
    const std::int64_t M = uni(rng, 1, 5), B = uni(rng, 1, 3);
    const std::int64_t w = uni(rng, 0, 2) == 0 ? uni(rng, 0, M) : 0;
    const std::int64_t local = uni(rng, 1, 4);
    const double tau = uni(rng, 0, 1) ? 0.1 : 0.5;  // (each draw its own statement: seeds replay on any compiler)
    return C(s, Pool(pages), trimkv_evictor({.budget = M, .buffer = B, .window = w}), {}, wgkv_admitter({.local = local, .tau = tau}));
  }
  static float gate(Rng& rng) { return GateMeta::meta(rng); }
};
// ---- one step's inputs, every layer -------------------------------------------------------------
enum class Fault { none, nan_meta, bad_meta, inf_key, nan_value, nan_query, wrong_head_dim, wrong_tokens, bad_gate, no_gate };
constexpr int kFaults = 10;

struct StepData {
  std::int64_t T = 1;
  bool with_gate = false;
  std::vector<float> k, v, meta, gate, q, out;  // [L,Hkv,T,d] x2, [L,Hkv,T] x2, [L,Hq,T,d] x2
  std::vector<std::uint8_t> appended, attended;  // per layer, for a step open through the layer API
};

template <class P>
StepData make_step(Rng& rng, const CacheShape& s, std::int64_t T) {
  std::normal_distribution<float> normal;
  StepData d;
  d.T = T;
  const auto L = static_cast<std::size_t>(s.layers);
  d.k.resize(L * static_cast<std::size_t>(s.kv_heads * T * s.head_dim));
  d.v.resize(d.k.size());
  for (auto& x : d.k) x = uni(rng, 0, 15) == 0 ? 0.0f : normal(rng);  // zero keys: KeyDiff's cosine 0
  for (auto& x : d.v) x = normal(rng);
  d.meta.resize(L * static_cast<std::size_t>(s.kv_heads * T));
  for (auto& x : d.meta) x = P::meta(rng);
  d.with_gate = P::gated || uni(rng, 0, 1) == 0;  // an optional gate: stored where a part declares Field::gate
  d.gate.resize(d.meta.size());
  for (auto& x : d.gate) x = GateMeta::meta(rng);
  d.q.resize(L * static_cast<std::size_t>(s.q_heads * T * s.head_dim));
  for (auto& x : d.q) x = normal(rng);
  d.out.assign(d.q.size(), std::nanf(""));
  d.appended.assign(L, 0);
  d.attended.assign(L, 0);
  return d;
}

template <class P>
void corrupt(Rng& rng, StepData& d, Fault f) {
  auto any = [&](std::vector<float>& v) -> float& { return v[static_cast<std::size_t>(uni(rng, 0, static_cast<std::int64_t>(v.size()) - 1))]; };
  switch (f) {
    case Fault::nan_meta: any(d.meta) = std::nanf(""); break;
    case Fault::bad_meta: any(d.meta) = P::bad_meta; break;
    case Fault::inf_key: any(d.k) = kInf; break;
    case Fault::nan_value: any(d.v) = std::nanf(""); break;
    case Fault::nan_query: any(d.q) = std::nanf(""); break;
    case Fault::bad_gate: any(d.gate) = uni(rng, 0, 1) ? 1.5f : std::nanf(""); break;
    default: break;
  }
}

// ---- the cache under test against the reference -------------------------------------------------
// The byte comparisons below (and snapshot.hpp's) read EntryMeta whole: it must have no padding.
static_assert(sizeof(EntryMeta) == sizeof(std::int32_t) + 4 * sizeof(float), "EntryMeta gained a field or padding");

struct Entry {
  std::int32_t position;
  std::vector<std::uint8_t> meta, k, v;  // EntryMeta, K and V, as bytes (-0 is not +0)
  bool operator==(const Entry&) const = default;
};

template <class C>
std::vector<Entry> head_entries(const C& cache, std::int64_t seq, int layer, int head) {
  const auto& pool = cache.allocator().pool();
  const auto h = cache.allocator().layout(seq, layer, head);
  std::vector<Entry> out;
  for (std::int64_t i = 0; i < h.length; ++i) {
    const auto slot = h.slot(i);
    const auto* m = reinterpret_cast<const std::uint8_t*>(&pool.meta(slot));
    const auto* k = reinterpret_cast<const std::uint8_t*>(pool.key(slot));
    const auto* v = reinterpret_cast<const std::uint8_t*>(pool.value(slot));
    const auto row = static_cast<std::size_t>(pool.head_dim()) * sizeof(float);
    out.push_back({pool.meta(slot).position, std::vector<std::uint8_t>(m, m + sizeof(EntryMeta)),
                   std::vector<std::uint8_t>(k, k + row), std::vector<std::uint8_t>(v, v + row)});
  }
  return out;  // in storage order: what attention walks and entry(i) returns
}

template <class C>
void expect_same(const C& sut, const C& ref, const std::map<std::int64_t, StepData>& open) {
  const auto& sh = sut.shape();
  std::int64_t used = 0;
  for (std::int64_t id = 0; id < kIds; ++id) {
    REQUIRE(sut.has_sequence(id) == ref.has_sequence(id));
    if (!sut.has_sequence(id)) continue;
    used += sut.allocator().pages_used(id);
    REQUIRE(sut.tokens(id) == ref.tokens(id));
    if (open.count(id) != 0) continue;  // compared when its step closes
    REQUIRE(sut.prompt_tokens(id) == ref.prompt_tokens(id));
    REQUIRE(sut.allocator().pages_used(id) == ref.allocator().pages_used(id));
    for (int l = 0; l < sh.layers; ++l)
      for (int h = 0; h < sh.kv_heads; ++h) {
        REQUIRE(sut.allocator().layout(id, l, h).block_table.size() == ref.allocator().layout(id, l, h).block_table.size());
        REQUIRE(head_entries(sut, id, l, h) == head_entries(ref, id, l, h));
      }
  }
  REQUIRE(sut.allocator().pages_free() + used == sut.allocator().pages_total());
}

// Pages `T` more entries per head take (every layer, or one), from the cache's own head lengths:
// every policy here stores every token it is given until the commit.
template <class C>
std::int64_t pages_needed(const C& cache, std::int64_t seq, std::int64_t T, int layer = -1) {
  auto pages = [](std::int64_t n) { return (n + kPage - 1) / kPage; };
  std::int64_t need = 0;
  for (int l = 0; l < cache.shape().layers; ++l) {
    if (layer >= 0 && l != layer) continue;
    for (int h = 0; h < cache.shape().kv_heads; ++h) {
      const auto len = cache.allocator().layout(seq, l, h).length;
      need += pages(len + T) - pages(len);
    }
  }
  return need;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, std::size_t first, std::size_t count) {
  return std::memcmp(a.data() + first, b.data() + first, count * sizeof(float)) == 0;
}

// A stream's cache shape and pool size.
CacheShape draw_shape(Rng& rng) {
  CacheShape sh{static_cast<int>(uni(rng, 1, 2)), static_cast<int>(uni(rng, 1, 2)), 0, static_cast<int>(uni(rng, 1, 4))};
  sh.q_heads = sh.kv_heads * static_cast<int>(uni(rng, 1, 2));
  return sh;
}

// One random stream's operations on the cache under test and its reference; P says what the
// policy's steps take (P::meta, bad_meta, observes, gated, prompt).
template <class P, class C>
void run_operations(C& sut, C& ref, Rng& rng, const CacheShape& sh, std::uint64_t seed) {
  using Step = typename C::SequenceStep;
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < kIds; ++i) ids.push_back(i);
  const std::int64_t L = sh.layers, H = sh.kv_heads, Hq = sh.q_heads, D = sh.head_dim;
  std::map<std::int64_t, StepData> open;  // steps open through the layer API, by sequence
  std::set<std::int64_t> probing;         // sequences whose next or open step is a probe (SPEC §10)

  std::ostringstream log;
  INFO(P::name, ": stream seed ", seed, " (replay: KVPOLICY_STREAM_SEED=", seed, "); operations so far:\n", log.str());
  // `for_the_fault`: the call would have been valid but for the injected fault
  auto rejected = [&](auto&& call, const char* what, bool for_the_fault = false) {
    const auto before = testing::snapshot(sut, ids);
    log << "  rejected " << what << "\n";
    ++coverage.rejected;
    coverage.fault_refused += for_the_fault;
    REQUIRE_THROWS_AS(call(), kvpolicy::Error);
    REQUIRE(testing::snapshot(sut, ids) == before);
  };
  auto views = [&](StepData& d, std::int64_t T, std::int64_t Dk, std::int64_t Tv, bool gate, bool attend, std::int64_t seq) {
    return Step{seq,
                View<const float, 4>(d.k.data(), {L, H, T, Dk}),
                View<const float, 4>(d.v.data(), {L, H, Tv, D}),
                View<const float, 3>(d.meta.data(), {L, H, T}),
                attend ? View<const float, 4>(d.q.data(), {L, Hq, T, D}) : View<const float, 4>{},
                attend ? View<float, 4>(d.out.data(), {L, Hq, T, D}) : View<float, 4>{},
                gate ? View<const float, 3>(d.gate.data(), {L, H, T}) : View<const float, 3>{}};
  };
  // The reference takes a committed step whole; its report, evicted list and attention must be the
  // cache under test's.
  auto reference_step = [&](std::int64_t seq, const StepData& d, const EvictionReport& got,
                            const std::vector<EvictedEntry>* got_evicted) {
    StepData r = d;
    r.out.assign(d.out.size(), std::nanf(""));
    const auto layer_size = static_cast<std::size_t>(Hq * d.T * D);
    for (int l = 0; l < sh.layers; ++l)  // a layer the step did not attend may hold any query (a NaN)
      if (!d.attended[static_cast<std::size_t>(l)]) std::fill_n(r.q.begin() + l * layer_size, layer_size, 0.25f);
    std::vector<EvictedEntry> evicted;
    if constexpr (C::takes_probes)
      if (probing.erase(seq) > 0) ref.open_probe(seq);  // the step was a probe in the cache under test
    const EvictionReport want = ref.step(views(r, d.T, D, d.T, d.with_gate, true, seq), &evicted);
    REQUIRE(got.triggered == want.triggered);
    REQUIRE(got.evicted == want.evicted);
    if (got_evicted != nullptr) {
      REQUIRE(got_evicted->size() == evicted.size());
      for (std::size_t i = 0; i < evicted.size(); ++i)
        REQUIRE(std::tie((*got_evicted)[i].layer, (*got_evicted)[i].head, (*got_evicted)[i].position) ==
                std::tie(evicted[i].layer, evicted[i].head, evicted[i].position));
    }
    for (int l = 0; l < sh.layers; ++l)  // every layer the cache under test attended
      if (d.attended[static_cast<std::size_t>(l)]) REQUIRE(same_bits(d.out, r.out, l * layer_size, layer_size));
    ++coverage.committed;
    coverage.evictions += want.evicted > 0;
    coverage.evicted += want.evicted;
  };

  for (int op = 0; op < 120; ++op) {
    std::int64_t id = uni(rng, 0, kIds - 1);  // mostly a known sequence, sometimes any id
    if (uni(rng, 0, 3) != 0) {
      std::vector<std::int64_t> known_ids;
      for (auto i : ids)
        if (sut.has_sequence(i)) known_ids.push_back(i);
      if (!known_ids.empty()) id = known_ids[static_cast<std::size_t>(uni(rng, 0, static_cast<std::int64_t>(known_ids.size()) - 1))];
    }
    const bool known = sut.has_sequence(id);
    StepData* o = known && open.count(id) ? &open.at(id) : nullptr;
    Fault fault = uni(rng, 0, 5) == 0 ? static_cast<Fault>(uni(rng, 1, kFaults - 1)) : Fault::none;
    if (fault == Fault::no_gate && !P::gated) fault = Fault::none;
    const std::int64_t T = uni(rng, 0, 3) == 0 ? uni(rng, 2, 10) : 1;  // a prefill chunk or a decode token
    const std::int64_t Dk = fault == Fault::wrong_head_dim ? D + 1 : D;
    int kind = static_cast<int>(uni(rng, 0, 9));
    if (o != nullptr && uni(rng, 0, 4) != 0) kind = static_cast<int>(uni(rng, 6, 9));  // mostly go on with an open step
    if (known && sut.allocator().pages_free() < 4 && uni(rng, 0, 3) == 0) kind = 1;    // a full pool frees a sequence
    log << "op " << op << ": kind " << kind << " seq " << id << " T " << T << " fault " << static_cast<int>(fault)
        << (known ? "" : " (unknown)") << (o ? " (open step)" : "") << "\n";
    // the step's values are refused for these faults; nan_query only when the step attends, a bad
    // gate only when there is one, and a missing gate only for an Admitter that reads it
    auto values_refused = [&](const StepData& d, bool attends) {
      switch (fault) {
        case Fault::none: return false;
        case Fault::nan_query: return attends;
        case Fault::bad_gate: return d.with_gate;
        case Fault::no_gate: return P::gated;
        default: return true;
      }
    };

    if constexpr (C::takes_probes)
      if (uni(rng, 0, 15) == 0) {  // open_probe: the next step of a sequence is a probe (SPEC §10)
        if (!known || o != nullptr) {
          rejected([&] { sut.open_probe(id); }, "open_probe of an unknown id or over an open step");
          continue;
        }
        log << "  open_probe\n";
        sut.open_probe(id);
        probing.insert(id);
        ++coverage.probes;
        ++coverage.accepted;
        expect_same(sut, ref, open);
        continue;
      }
    if (kind == 0) {  // add_sequence, with a declared prompt now and then, or an invalid one
      const std::int64_t prompt = fault != Fault::none && uni(rng, 0, 3) == 0 ? -2
                                  : P::prompt && uni(rng, 0, 1)             ? uni(rng, 0, 12)
                                                                            : -1;
      if (known || prompt < -1) {
        rejected([&] { sut.add_sequence(id, prompt); }, "add_sequence", !known);
        continue;
      }
      sut.add_sequence(id, prompt);
      ref.add_sequence(id, prompt);
    } else if (kind == 1) {  // remove_sequence (an open step goes with it)
      if (!known) {
        rejected([&] { sut.remove_sequence(id); }, "remove_sequence of an unknown id");
        continue;
      }
      sut.remove_sequence(id);
      ref.remove_sequence(id);
      open.erase(id);
      probing.erase(id);
    } else if (kind <= 4) {  // step(): the whole forward step of one sequence
      StepData d = make_step<P>(rng, sh, T);
      const bool attend = P::observes || uni(rng, 0, 1) == 0;
      const bool gate = d.with_gate && fault != Fault::no_gate;
      StepData bad = d;
      corrupt<P>(rng, bad, fault);
      const std::int64_t Tv = fault == Fault::wrong_tokens ? T + 1 : T;
      bad.k.resize(static_cast<std::size_t>(L * H * T * Dk), 0.5f);
      bad.v.resize(static_cast<std::size_t>(L * H * Tv * D), 0.5f);
      const bool valid = known && o == nullptr && pages_needed(sut, id, T) <= sut.allocator().pages_free();
      std::vector<EvictedEntry> evicted;
      auto call = [&] { return sut.step(views(bad, T, Dk, Tv, gate, attend, id), &evicted); };
      if (!valid || values_refused(d, attend)) {
        rejected(call, "step", valid);
        continue;
      }
      const EvictionReport report = call();
      std::fill(bad.attended.begin(), bad.attended.end(), std::uint8_t{attend});
      reference_step(id, bad, report, &evicted);
    } else if (kind == 5) {  // step_batch of one or two ids (maybe the same one twice, maybe unknown)
      const int size = uni(rng, 0, 4) == 0 ? 1 : 2;
      const std::int64_t id2 = uni(rng, 0, kIds - 1);
      const std::int64_t T2 = uni(rng, 0, 3) == 0 ? uni(rng, 2, 6) : 1;
      const int faulty = static_cast<int>(uni(rng, 0, size - 1));  // the element the fault goes to
      const std::int64_t seq[2] = {id, id2}, Ts[2] = {T, T2};
      std::vector<StepData> d;
      std::vector<bool> attends;
      std::vector<Step> batch;
      bool valid = true, refused = false;
      std::int64_t pages = 0;
      for (int i = 0; i < size; ++i) {
        d.push_back(make_step<P>(rng, sh, Ts[i]));
        attends.push_back(P::observes || uni(rng, 0, 1) == 0);
      }
      for (int i = 0; i < size; ++i) {
        const bool f = i == faulty;
        StepData& e = d[static_cast<std::size_t>(i)];
        if (f) corrupt<P>(rng, e, fault);
        const std::int64_t Ti = Ts[i], Tv = f && fault == Fault::wrong_tokens ? Ti + 1 : Ti, Dki = f ? Dk : D;
        e.k.resize(static_cast<std::size_t>(L * H * Ti * Dki), 0.5f);
        e.v.resize(static_cast<std::size_t>(L * H * Tv * D), 0.5f);
        batch.push_back(views(e, Ti, Dki, Tv, e.with_gate && !(f && fault == Fault::no_gate), attends[static_cast<std::size_t>(i)], seq[i]));
        valid = valid && sut.has_sequence(seq[i]) && open.count(seq[i]) == 0 && (i == 0 || seq[1] != seq[0]);
        if (valid) pages += pages_needed(sut, seq[i], Ti);
        refused = refused || (f && values_refused(e, attends[static_cast<std::size_t>(i)]));
      }
      valid = valid && pages <= sut.allocator().pages_free();
      if (!valid || refused) {
        rejected([&] { sut.step_batch(batch); }, "step_batch", valid);
        continue;
      }
      const auto reports = sut.step_batch(batch);
      REQUIRE(reports.size() == static_cast<std::size_t>(size));
      for (int i = 0; i < size; ++i) {
        StepData& e = d[static_cast<std::size_t>(i)];
        std::fill(e.attended.begin(), e.attended.end(), std::uint8_t{attends[static_cast<std::size_t>(i)]});
        reference_step(seq[i], e, reports[static_cast<std::size_t>(i)], nullptr);
      }
      coverage.batch_commits += size;
    } else if (kind <= 7) {  // layer API: append one layer (or a layer out of range)
      int layer = static_cast<int>(uni(rng, 0, 7) == 0 ? (uni(rng, 0, 1) ? -1 : sh.layers) : uni(rng, 0, sh.layers - 1));
      if (o != nullptr && layer >= 0 && layer < sh.layers && uni(rng, 0, 4) != 0)  // mostly a layer still to append
        for (int l = 0; l < sh.layers; ++l)
          if (!o->appended[static_cast<std::size_t>(l)]) layer = l;
      const std::int64_t Tl = o != nullptr && uni(rng, 0, 4) != 0 ? o->T : T;
      StepData fresh = o != nullptr && o->T == Tl ? StepData{} : make_step<P>(rng, sh, Tl);
      StepData& d = o != nullptr && o->T == Tl ? *o : fresh;
      const int lc = std::clamp(layer, 0, sh.layers - 1);
      // this layer's slices, corrupted by the fault
      auto slice = [&](const std::vector<float>& v, std::int64_t per_layer) {
        return std::vector<float>(v.begin() + lc * per_layer, v.begin() + (lc + 1) * per_layer);
      };
      StepData bad;
      bad.k = slice(d.k, H * Tl * D), bad.v = slice(d.v, H * Tl * D), bad.meta = slice(d.meta, H * Tl),
      bad.gate = slice(d.gate, H * Tl), bad.q = {0.0f};
      corrupt<P>(rng, bad, fault);
      const std::int64_t Tlv = fault == Fault::wrong_tokens ? Tl + 1 : Tl;
      bad.k.resize(static_cast<std::size_t>(H * Tl * Dk), 0.5f);
      bad.v.resize(static_cast<std::size_t>(H * Tlv * D), 0.5f);
      const bool gate = d.with_gate && fault != Fault::no_gate;
      auto call = [&] {
        sut.append(id, layer, View<const float, 3>(bad.k.data(), {H, Tl, Dk}), View<const float, 3>(bad.v.data(), {H, Tlv, D}),
                   View<const float, 2>(bad.meta.data(), {H, Tl}),
                   gate ? View<const float, 2>(bad.gate.data(), {H, Tl}) : View<const float, 2>{});
      };
      const bool valid = known && layer >= 0 && layer < sh.layers &&
                         (o == nullptr || (o->T == Tl && !o->appended[static_cast<std::size_t>(layer)])) &&
                         pages_needed(sut, id, Tl, layer) <= sut.allocator().pages_free();
      if (!valid || values_refused(d, false)) {
        rejected(call, "append", valid);
        continue;
      }
      call();
      if (o == nullptr) o = &(open[id] = std::move(fresh));
      o->appended[static_cast<std::size_t>(layer)] = 1;
    } else if (kind == 8) {  // layer API: attend one layer (or a layer out of range)
      const int layer = static_cast<int>(uni(rng, 0, 7) == 0 ? (uni(rng, 0, 1) ? -1 : sh.layers) : uni(rng, 0, sh.layers - 1));
      const std::int64_t To = o != nullptr ? o->T : T, Tq = fault == Fault::wrong_tokens ? To + 1 : To;
      const int lc = std::clamp(layer, 0, sh.layers - 1);
      std::vector<float> q(static_cast<std::size_t>(Hq * Tq * D), 0.25f);
      if (o != nullptr) std::copy_n(o->q.begin() + lc * Hq * To * D, Hq * To * D, q.begin());
      if (fault == Fault::nan_query) q[static_cast<std::size_t>(uni(rng, 0, static_cast<std::int64_t>(q.size()) - 1))] = std::nanf("");
      const std::int64_t Dq = fault == Fault::wrong_head_dim ? D + 1 : D;
      q.resize(static_cast<std::size_t>(Hq * Tq * Dq), 0.5f);
      std::vector<float> out(q.size(), std::nanf(""));
      auto call = [&] {
        sut.attend(id, layer, View<const float, 3>(q.data(), {Hq, Tq, Dq}), View<float, 3>(out.data(), {Hq, Tq, Dq}));
      };
      const bool valid = o != nullptr && layer >= 0 && layer < sh.layers && o->appended[static_cast<std::size_t>(layer)] &&
                         !(P::observes && o->attended[static_cast<std::size_t>(layer)]);
      const bool faulty = fault == Fault::nan_query || fault == Fault::wrong_head_dim || fault == Fault::wrong_tokens;
      if (!valid || faulty) {
        rejected(call, "attend", valid);
        continue;
      }
      call();
      std::copy(out.begin(), out.end(), o->out.begin() + lc * Hq * Tq * D);
      o->attended[static_cast<std::size_t>(layer)] = 1;
    } else {  // layer API: commit, or take the open step back
      if (uni(rng, 0, 3) == 0) {
        if (!known) {
          rejected([&] { sut.abort_step(id); }, "abort_step of an unknown id");
          continue;
        }
        sut.abort_step(id);
        probing.erase(id);  // a probe taken back, or one not yet begun, goes too
        if (o != nullptr)
          coverage.aborted_attended += std::any_of(o->attended.begin(), o->attended.end(), [](std::uint8_t a) { return a != 0; });
        coverage.aborted += open.erase(id);
      } else {
        auto all = [](const std::vector<std::uint8_t>& v) { return std::all_of(v.begin(), v.end(), [](std::uint8_t x) { return x != 0; }); };
        const bool ok = o != nullptr && all(o->appended) && (!P::observes || all(o->attended));
        std::vector<EvictedEntry> evicted;
        if (!ok) {
          rejected([&] { sut.commit(id, &evicted); }, "commit");
          continue;
        }
        const EvictionReport report = sut.commit(id, &evicted);
        const StepData d = std::move(*o);
        open.erase(id);
        reference_step(id, d, report, &evicted);
        ++coverage.layer_commits;
      }
    }
    ++coverage.accepted;
    expect_same(sut, ref, open);
  }
}

// One random stream of a policy written out above.
template <class P>
void run_stream(std::uint64_t seed) {
  using C = typename P::C;
  Rng rng(seed);
  const CacheShape sh = draw_shape(rng);
  const std::int64_t pages_total = uni(rng, 2, 48);
  Rng config_rng(seed ^ 0x5eedull);
  C sut = P::make(config_rng, sh, pages_total);
  config_rng.seed(seed ^ 0x5eedull);
  C ref = P::make(config_rng, sh, pages_total);
  run_operations<P>(sut, ref, rng, sh, seed);
}

// Streams per policy; KVPOLICY_STREAM_SEED runs just one (of the policy whose base it falls under).
// KVPOLICY_STREAM_SEED=<seed> runs that one stream, where it falls in [base, base + span), and
// nothing else; otherwise every stream runs, counted in `coverage`. Returns whether it replayed.
template <class Run>
bool run_seeds(std::uint64_t base, std::uint64_t span, int count, Run run) {
  if (const char* env = std::getenv("KVPOLICY_STREAM_SEED")) {
    const std::uint64_t seed = std::strtoull(env, nullptr, 10);
    if (seed / span == base / span) run(seed);
    return true;
  }
  coverage = {};
  for (int i = 0; i < count; ++i) run(base + static_cast<std::uint64_t>(i));
  return false;
}

template <class P>
void run_streams(std::uint64_t base, int count) {
  if (run_seeds(base, 100000, count, [](std::uint64_t seed) { run_stream<P>(seed); })) return;
  MESSAGE(std::string(P::name), ", ", count, " streams: ", coverage.accepted, " calls accepted, ", coverage.rejected,
          " rejected (", coverage.fault_refused, " for their fault alone), ", coverage.committed, " steps committed (",
          coverage.layer_commits, " through the layer API, ", coverage.batch_commits, " in batches), ", coverage.aborted,
          " taken back (", coverage.aborted_attended, " after attending), ", coverage.evictions, " evictions removed ",
          coverage.evicted, " entries");
  CHECK(coverage.evictions > count);
  CHECK(coverage.fault_refused > count);
  CHECK(coverage.aborted > count / 4);
  CHECK(coverage.aborted_attended > count / 10);
  CHECK(coverage.layer_commits > count);
  // a valid batch is rare (known, distinct, unopened ids): about one element commits per two streams,
  // so a quarter per stream is the bar the 75 streams of an ASan run reach as the 300 do
  CHECK(coverage.batch_commits > count / 4);
}

// ---- every registered policy (registry.hpp) -------------------------------------------------------
// A policy registered tomorrow runs here with no edit: its options take small random values (a
// draw its Cache refuses is drawn again; an option this list does not know keeps its default),
// its steps the write score its Inputs and its Scorer name, and what its Cache type declares says
// whether they attend and take a gate.
template <registry::Policy R, class C>
struct Registered {
  static constexpr const char* name = R::name.data();
  using S = typename C::scorer_type;
  static constexpr bool observes = kvpolicy::detail::ScorerRecords<S>::observes_attention;
  static constexpr bool gated = admitter_reads_gate<typename C::admitter_type>;
  static constexpr bool prompt = true;
  static float meta(Rng& rng) {
    if constexpr (R::inputs::scores == inputs::Scores::gate)
      return GateMeta::meta(rng);
    else if constexpr (scorer_static_score<S>)
      return FrozenMeta::meta(rng);
    else
      return LogBetaMeta::meta(rng);
  }
  static constexpr float bad_meta = scorer_static_score<S> ? kInf : 0.5f;
};

// Small values of a policy's options, as text: the budgets and rings of a few entries the streams
// overrun, the variants now and then.
template <registry::Policy R>
std::map<std::string, std::string, std::less<>> draw_options(Rng& rng) {
  std::map<std::string, std::string, std::less<>> given;
  for (const registry::Option& o : R::options) {
    const std::string_view n = o.name;
    std::string value;
    if (n == "budget") value = std::to_string(uni(rng, 1, 5));
    else if (n == "buffer") value = std::to_string(uni(rng, 1, 3));
    else if (n == "window" || n == "sinks") value = std::to_string(uni(rng, 0, 2));
    else if (n == "local") value = std::to_string(uni(rng, 1, 4));
    else if (n == "avg-budget") value = std::to_string(uni(rng, 0, 1) ? 0 : uni(rng, 1, 3));
    else if (n == "horizon") value = std::to_string(uni(rng, 1, 3));
    else if (n == "recency") value = std::to_string(uni(rng, -1, 2));
    else if (n == "seed") value = std::to_string(uni(rng, 0, 1000));
    else if (n == "pool-kernel") value = std::to_string(2 * uni(rng, 0, 2) + 1);
    else if (n == "threshold") value = uni(rng, 0, 3) == 0 ? "0.5" : "0";
    else if (n == "min-tokens") value = std::to_string(uni(rng, 0, 1) ? 0 : uni(rng, 1, 3));  // refused without a threshold: drawn again
    else if (n == "floor") value = uni(rng, 0, 2) == 0 ? "0.25" : "0";
    else if (n == "tau") value = uni(rng, 0, 1) ? "0.1" : "0.5";
    else if (n == "safeguard") value = uni(rng, 0, 1) ? "0.2" : "0.5";
    else if (n == "ratio") value = uni(rng, 0, 3) == 0 ? "0" : uni(rng, 0, 1) ? "0.5" : "0.9";
    else if (n == "prefix") value = std::to_string(uni(rng, 0, 3));
    else if (o.kind == registry::Kind::choice) {
      std::int64_t count = 0;
      while (count < static_cast<std::int64_t>(o.choices.size()) && !o.choices[static_cast<std::size_t>(count)].empty()) ++count;
      value = std::string(o.choices[static_cast<std::size_t>(uni(rng, 0, count - 1))]);
    } else {
      continue;  // its default
    }
    given[std::string(n)] = value;
  }
  return given;
}

template <registry::Policy R>
void run_registered_stream(std::uint64_t seed) {
  Rng rng(seed);
  CacheShape sh = draw_shape(rng);
  const std::int64_t pages_total = uni(rng, 2, 48);
  Rng config_rng(seed ^ 0x5eedull);
  std::map<std::string, std::string, std::less<>> given;
  for (int attempt = 0;; ++attempt) {  // a combination the policy refuses (w > M, ...) is drawn again
    given = draw_options<R>(config_rng);
    try {
      R::template make<cpu_backend>(registry::Values(R::name, R::options, given), sh, Pool(pages_total), [](auto&) {});
      break;
    } catch (const kvpolicy::Error&) {
      REQUIRE_MESSAGE(attempt < 1000, R::name, ": no drawn configuration is accepted");
      if (attempt % 20 == 19) sh = draw_shape(config_rng);  // a shape it refuses (RoPE pairs need an even d)
    }
  }
  const registry::Values values(R::name, R::options, given);
  R::template make<cpu_backend>(values, sh, Pool(pages_total), [&](auto& sut) {
    R::template make<cpu_backend>(values, sh, Pool(pages_total), [&](auto& ref) {
      using C = std::remove_reference_t<decltype(sut)>;
      if constexpr (std::is_same_v<C, std::remove_reference_t<decltype(ref)>>)
        run_operations<Registered<R, C>>(sut, ref, rng, sh, seed);
      else
        FAIL(R::name, ": the same options built two different compositions");
    });
  });
}

template <registry::Policy R>
void run_registered_streams(std::uint64_t base, int count) {
  if (run_seeds(base, 10000, count, [](std::uint64_t seed) { run_registered_stream<R>(seed); })) return;
  MESSAGE(std::string(R::name), " (registered), ", count, " streams: ", coverage.accepted, " calls accepted, ",
          coverage.rejected, " rejected (", coverage.fault_refused, " for their fault alone), ", coverage.committed,
          " steps committed, ", coverage.aborted, " taken back, ", coverage.probes, " probes opened, ",
          coverage.evictions, " evictions removed ", coverage.evicted, " entries");
  // a policy without options (the full cache) has no budget a stream could reach
  CHECK((coverage.evictions > 0 || R::options.empty()));
  CHECK(coverage.fault_refused > count);
  CHECK(coverage.aborted > count / 4);
  CHECK(coverage.layer_commits > count);
  // a valid batch is rare (known, distinct, unopened ids): about one element commits per two streams,
  // so a quarter per stream is the bar the 75 streams of an ASan run reach as the 300 do
  CHECK(coverage.batch_commits > count / 4);
}

}  // namespace

TEST_CASE("state machine: every registered policy against its reference over random operation streams") {
  std::uint64_t base = 2000000;  // 2000000 + 10000 k for the k-th registered policy
  registry::for_each([&]<registry::Policy R>() {
    run_registered_streams<R>(base, random_trials(300));
    base += 10000;
  });
}

// Seeds: test_state_machine.cpp uses 100000..399999, the registered policies 2000000 onwards.
TEST_CASE("state machine: WG-KV under the appendix-K budget, every setting drawn, against its reference over random operation streams") {
  run_streams<WGKVBudget>(1100000, random_trials(300));
}
TEST_CASE("state machine: WG-KV admission + TRIM-KV eviction against its reference over random operation streams") {
  run_streams<WGKVRetention>(1200000, random_trials(300));
}
