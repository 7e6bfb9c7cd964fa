/// \file
/// kvpolicy/any_cache.hpp — every Cache behind one interface: what a program that chooses its
/// policy at run time holds (registry::open builds it from a policy's name). Each call is the
/// Cache's own, with its checks and errors (cache.hpp); a call the wrapped Cache does not have
/// (attend over engine-owned K/V, set_step_scores for a Scorer without frozen scores) is an error
/// that says so, and the capability queries below tell a program which calls apply.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvpolicy/cache.hpp"

namespace kvpolicy {

/// A Cache behind virtual calls of the Cache's own names, whatever its parts: what registry::open returns,
/// for a program that picks its policy at run time.
class AnyCache {
 public:
  virtual ~AnyCache() = default;

  /// ---- what the Cache is (Cache::stores_kv, observes_attention; SPEC §4 frozen scores) ---------
  virtual const CacheShape& shape() const = 0;
  /// Whether it holds its entries' K/V (false over engine-owned K/V, SPEC §9: no attend()).
  virtual bool stores_kv() const = 0;
  /// Whether every step must attend() every layer (the Scorer reads the attention).
  virtual bool observes_attention() const = 0;
  /// Whether the Scorer reads stored keys or the attention over them (Cache::reads_stored_kv); over
  /// engine-owned K/V it then reads the engine's keys (use_engine_keys) and, where it observes
  /// the attention, is shown each layer's queries (observe) instead of attending.
  virtual bool reads_stored_kv() const = 0;
  /// Whether the Scorer takes frozen scores after append (Cache::set_step_scores).
  virtual bool takes_step_scores() const = 0;
  /// w, the newest positions the Evictor protects in every head (SPEC §5, §8); 0 where it has none.
  virtual std::int64_t protected_window() const = 0;
  /// Bytes the pool holds (memory::Paged::bytes_for: K/V and metadata, metadata only over
  /// engine-owned K/V).
  virtual std::int64_t pool_bytes() const = 0;

  /// ---- sequences and what they hold (Cache's calls of the same names) --------------------------
  virtual void add_sequence(std::int64_t seq, std::int64_t prompt_tokens = -1) = 0;
  virtual void remove_sequence(std::int64_t seq) = 0;
  virtual bool has_sequence(std::int64_t seq) const = 0;
  virtual std::int64_t tokens(std::int64_t seq) const = 0;
  virtual std::int64_t prompt_tokens(std::int64_t seq) const = 0;
  virtual std::int64_t length(std::int64_t seq, int layer, int head) const = 0;
  virtual std::int64_t total_length(std::int64_t seq) const = 0;
  virtual HeadContents head_contents(std::int64_t seq, int layer, int head) const = 0;
  virtual EntryMeta entry(std::int64_t seq, int layer, int head, std::int64_t i) const = 0;
  virtual std::int64_t pages_free() const = 0;
  virtual std::int64_t pages_total() const = 0;

  /// ---- steps -----------------------------------------------------------------------------------
  virtual void append(std::int64_t seq, int layer, View<const float, 3> keys, View<const float, 3> values,
                      View<const float, 2> log_beta, View<const float, 2> gate = {}) = 0;
  virtual void set_step_scores(std::int64_t seq, int layer, View<const float, 2> scores) = 0;
  virtual void attend(std::int64_t seq, int layer, View<const float, 3> queries, View<float, 3> out) = 0;
  /// Over engine-owned K/V (SPEC §9): where the engine keeps its keys, for a Scorer that reads them
  /// (Cache::use_engine_keys), and a layer's queries for one that ranks by attention (Cache::observe).
  virtual void use_engine_keys(EngineKeys keys) = 0;
  virtual void observe(std::int64_t seq, int layer, View<const float, 3> queries) = 0;
  virtual EvictionReport commit(std::int64_t seq, std::vector<EvictedEntry>* evicted = nullptr) = 0;
  virtual void abort_step(std::int64_t seq) = 0;
  /// Cache::open_probe (SPEC §10); refused where the Cache takes no probe steps (Cache::takes_probes).
  virtual void open_probe(std::int64_t seq) = 0;
  virtual EvictionReport step(const SequenceStep& s, std::vector<EvictedEntry>* evicted = nullptr) = 0;
  virtual std::vector<EvictionReport> step_batch(std::span<const SequenceStep> batch) = 0;
};

/// AnyCache over a Cache C it owns (its calls take the interface's defaults).
template <class C>
class AnyCacheOf final : public AnyCache {
 public:
  explicit AnyCacheOf(C&& cache) : c_(std::move(cache)) {}
  C& cache() { return c_; }
  const C& cache() const { return c_; }

  const CacheShape& shape() const override { return c_.shape(); }
  bool stores_kv() const override { return C::stores_kv; }
  bool observes_attention() const override { return C::observes_attention; }
  bool reads_stored_kv() const override { return C::reads_stored_kv; }
  bool takes_step_scores() const override {
    return requires(C& c) { c.set_step_scores(std::int64_t{}, 0, View<const float, 2>{}); };
  }
  std::int64_t protected_window() const override {
    if constexpr (requires { c_.evictor().window; })
      return c_.evictor().window;
    else if constexpr (requires { c_.evictor().inner.window; })  // a rank's Evictor (dist/sharded.hpp)
      return c_.evictor().inner.window;
    else
      return 0;
  }
  std::int64_t pool_bytes() const override {
    using Alloc = typename C::allocator_type;
    if constexpr (requires { Alloc::bytes_for(c_.shape(), c_.pages_total()); })
      return Alloc::bytes_for(c_.shape(), c_.pages_total());
    else
      fail("AnyCache::pool_bytes: this Cache's Allocator does not say its bytes (memory::Paged does)");
  }

  void add_sequence(std::int64_t seq, std::int64_t prompt_tokens = -1) override { c_.add_sequence(seq, prompt_tokens); }
  void remove_sequence(std::int64_t seq) override { c_.remove_sequence(seq); }
  bool has_sequence(std::int64_t seq) const override { return c_.has_sequence(seq); }
  std::int64_t tokens(std::int64_t seq) const override { return c_.tokens(seq); }
  std::int64_t prompt_tokens(std::int64_t seq) const override { return c_.prompt_tokens(seq); }
  std::int64_t length(std::int64_t seq, int layer, int head) const override { return c_.length(seq, layer, head); }
  std::int64_t total_length(std::int64_t seq) const override { return c_.total_length(seq); }
  HeadContents head_contents(std::int64_t seq, int layer, int head) const override {
    return c_.head_contents(seq, layer, head);
  }
  EntryMeta entry(std::int64_t seq, int layer, int head, std::int64_t i) const override {
    return c_.entry(seq, layer, head, i);
  }
  std::int64_t pages_free() const override { return c_.pages_free(); }
  std::int64_t pages_total() const override { return c_.pages_total(); }

  void append(std::int64_t seq, int layer, View<const float, 3> keys, View<const float, 3> values,
              View<const float, 2> log_beta, View<const float, 2> gate = {}) override {
    c_.append(seq, layer, keys, values, log_beta, gate);
  }
  void set_step_scores(std::int64_t seq, int layer, View<const float, 2> scores) override {
    if constexpr (requires { c_.set_step_scores(seq, layer, scores); })
      c_.set_step_scores(seq, layer, scores);
    else
      fail("Cache::set_step_scores: this policy's Scorer takes no frozen scores (SPEC §4): give its scores to append()");
  }
  void attend(std::int64_t seq, int layer, View<const float, 3> queries, View<float, 3> out) override {
    if constexpr (C::stores_kv)
      c_.attend(seq, layer, queries, out);
    else
      fail("Cache::attend: this Cache keeps no K/V (engine-owned, SPEC §9): the engine attends over its own");
  }
  void use_engine_keys(EngineKeys keys) override {
    if constexpr (requires { c_.use_engine_keys(std::move(keys)); })
      c_.use_engine_keys(std::move(keys));
    else if constexpr (C::stores_kv)
      fail("Cache::use_engine_keys: this Cache keeps its own K/V; it reads no keys of the engine's");
    else
      fail("Cache::use_engine_keys: this policy reads its entries' metadata alone, never the engine's keys");
  }
  void observe(std::int64_t seq, int layer, View<const float, 3> queries) override {
    if constexpr (requires { c_.observe(seq, layer, queries); })
      c_.observe(seq, layer, queries);
    else if constexpr (C::stores_kv)
      fail("Cache::observe: this Cache keeps its own K/V: attend() over it");
    else
      fail("Cache::observe: this policy does not rank by attention; there is nothing to show it");
  }
  EvictionReport commit(std::int64_t seq, std::vector<EvictedEntry>* evicted = nullptr) override { return c_.commit(seq, evicted); }
  void abort_step(std::int64_t seq) override { c_.abort_step(seq); }
  void open_probe(std::int64_t seq) override {
    if constexpr (C::takes_probes)
      c_.open_probe(seq);
    else
      fail("Cache::open_probe: this Cache takes no probe steps (SPEC §10: its Backend cannot forget a step's record "
           "while keeping its entries, or its Admitter's ring counts tokens a probe's never join)");
  }
  EvictionReport step(const SequenceStep& s, std::vector<EvictedEntry>* evicted = nullptr) override { return c_.step(s, evicted); }
  std::vector<EvictionReport> step_batch(std::span<const SequenceStep> batch) override { return c_.step_batch(batch); }

 private:
  C c_;
};

}  // namespace kvpolicy
