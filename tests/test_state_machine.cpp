// The cache API as a state machine (tests/state_machine.hpp) on the CPU Cache: TRIM-KV per head,
// DBTrimKV global and layer-wise, each against its executable model over random operation streams.
//
// On failure the stream's seed is printed; KVPOLICY_STREAM_SEED=<seed> replays that one stream.
#include <doctest/doctest.h>

#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/trimkv.hpp"
#include "state_machine.hpp"
#include "trials.hpp"

using namespace kvpolicy;

namespace {

constexpr int kPage = 4;
using Pool = memory::Paged<kPage, float>;

}  // namespace

TEST_CASE("state machine: TRIM-KV per-head cache against its model over random operation streams") {
  using C = Cache<score::RetentionDecay, admit::All, evict::PerHead<trigger::Buffered>, Pool, cpu_backend>;
  state_machine::run_streams<C>(state_machine::Policy::per_head, 100000, random_trials(1000), [](const state_machine::Model& m) {
    return C(m.shape, Pool(m.pages_total),
             trimkv_evictor({.budget = m.params.budget,
                             .buffer = m.params.buffer,
                             .window = m.params.window,
                             .threshold = m.params.threshold,
                             .min_tokens = m.params.min_tokens}));
  });
}

TEST_CASE("state machine: DBTrimKV global cache against its model over random operation streams") {
  using C = Cache<score::Lookahead, admit::All, evict::Global, Pool, cpu_backend>;
  state_machine::run_streams<C>(state_machine::Policy::global, 200000, random_trials(600), [](const state_machine::Model& m) {
    const DBTrimKVConfig c{.budget = m.params.budget,
                           .buffer = m.params.buffer,
                           .window = m.params.window,
                           .threshold = m.params.threshold,
                           .horizon = m.horizon,
                           .floor_ratio = m.params.floor_ratio,
                           .min_tokens = m.params.min_tokens};
    return C(m.shape, Pool(m.pages_total), dbtrimkv_evictor(c), dbtrimkv_scorer(c));
  });
}

TEST_CASE("state machine: DBTrimKV layer-wise cache against its model over random operation streams") {
  using C = Cache<score::Lookahead, admit::All, evict::LayerWise, Pool, cpu_backend>;
  state_machine::run_streams<C>(state_machine::Policy::layer_wise, 300000, random_trials(600), [](const state_machine::Model& m) {
    const DBTrimKVConfig c{.budget = m.params.budget,
                           .buffer = m.params.buffer,
                           .window = m.params.window,
                           .threshold = m.params.threshold,
                           .horizon = m.horizon,
                           .floor_ratio = m.params.floor_ratio,
                           .min_tokens = m.params.min_tokens};
    return C(m.shape, Pool(m.pages_total), dbtrimkv_layerwise_evictor(c), dbtrimkv_scorer(c));
  });
}

TEST_CASE("state machine: invalid configurations are refused at construction") {
  const CacheShape shape{2, 2, 4, 8};
  using T = TrimKVCache<cpu_backend, float, kPage>;
  using G = DBTrimKVCache<cpu_backend, float, kPage>;
  CHECK_THROWS_AS(T(shape, Pool(8), trimkv_evictor({.budget = 0, .buffer = 4})), kvpolicy::Error);           // budget 0
  CHECK_THROWS_AS(T(shape, Pool(8), trimkv_evictor({.budget = 4, .buffer = 0})), kvpolicy::Error);           // buffer 0
  CHECK_THROWS_AS(T(shape, Pool(8), trimkv_evictor({.budget = 4, .buffer = 2, .window = -1})), kvpolicy::Error);       // negative window
  CHECK_THROWS_AS(T(shape, Pool(8), trimkv_evictor({.budget = 4, .buffer = 2, .threshold = -0.5})), kvpolicy::Error);  // alpha < 0
  CHECK_THROWS_AS(T(shape, Pool(0), trimkv_evictor({.budget = 4, .buffer = 2})), kvpolicy::Error);           // empty pool
  CHECK_THROWS_AS(T(CacheShape{2, 2, 3, 8}, Pool(8), trimkv_evictor({.budget = 4, .buffer = 2})), kvpolicy::Error);  // Hq % Hkv
  CHECK_THROWS_AS(G(shape, Pool(8), dbtrimkv_evictor({.budget = 0, .buffer = 4}), dbtrimkv_scorer({})), kvpolicy::Error);
  CHECK_THROWS_AS(G(shape, Pool(8), dbtrimkv_evictor({.budget = 4, .buffer = 2, .horizon = 2, .floor_ratio = 1.0}), dbtrimkv_scorer({})), kvpolicy::Error);  // f = 1
  CHECK_THROWS_AS(G(shape, Pool(8), dbtrimkv_evictor({.budget = 4, .buffer = 2, .threshold = 0.3, .horizon = 2, .floor_ratio = 0.5}), dbtrimkv_scorer({})), kvpolicy::Error);
  CHECK_THROWS_AS(G(shape, Pool(8), dbtrimkv_evictor({.budget = 4, .buffer = 2}), score::Lookahead{0}), kvpolicy::Error);
}
