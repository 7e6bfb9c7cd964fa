// The Python module's one Cache type: every registered policy's kvpolicy::Cache (cpu_backend)
// behind one interface, chosen at run time by name as kvpolicy-lm chooses it (registry::visit).
// The model owns the policy's Cache, moved out of the factory that built it (P::make).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvpolicy/registry.hpp"
#include "kvpolicy/trimkv.hpp"

namespace kvpolicy::python {

class AnyCache {
 public:
  virtual ~AnyCache() = default;
  virtual const CacheShape& shape() const = 0;
  virtual void add_sequence(std::int64_t seq, std::int64_t prompt_tokens) = 0;
  virtual void remove_sequence(std::int64_t seq) = 0;
  virtual bool has_sequence(std::int64_t seq) const = 0;
  virtual std::int64_t tokens(std::int64_t seq) const = 0;
  virtual std::int64_t prompt_tokens(std::int64_t seq) const = 0;
  virtual std::int64_t length(std::int64_t seq, int layer, int head) const = 0;
  virtual std::int64_t total_length(std::int64_t seq) const = 0;
  virtual HeadContents head_contents(std::int64_t seq, int layer, int head) const = 0;
  virtual std::int64_t pages_free() const = 0;
  virtual std::int64_t pages_total() const = 0;
  virtual void append(std::int64_t seq, int layer, View<const float, 3> keys, View<const float, 3> values,
                      View<const float, 2> scores, View<const float, 2> gates) = 0;
  /// Whether the Scorer takes frozen scores after append (SPEC §4, Cache::set_step_scores).
  virtual bool takes_step_scores() const = 0;
  virtual void set_step_scores(std::int64_t seq, int layer, View<const float, 2> scores) = 0;
  virtual void attend(std::int64_t seq, int layer, View<const float, 3> queries, View<float, 3> out) = 0;
  virtual EvictionReport commit(std::int64_t seq, std::vector<EvictedEntry>* evicted) = 0;
  virtual void abort_step(std::int64_t seq) = 0;
  virtual EvictionReport step(const SequenceStep& s, std::vector<EvictedEntry>* evicted) = 0;
  virtual std::vector<EvictionReport> step_batch(std::span<const SequenceStep> batch) = 0;
};

template <class C>
class CacheModel final : public AnyCache {
 public:
  explicit CacheModel(C&& cache) : c_(std::move(cache)) {}

  const CacheShape& shape() const override { return c_.shape(); }
  void add_sequence(std::int64_t seq, std::int64_t prompt_tokens) override { c_.add_sequence(seq, prompt_tokens); }
  void remove_sequence(std::int64_t seq) override { c_.remove_sequence(seq); }
  bool has_sequence(std::int64_t seq) const override { return c_.has_sequence(seq); }
  std::int64_t tokens(std::int64_t seq) const override { return c_.tokens(seq); }
  std::int64_t prompt_tokens(std::int64_t seq) const override { return c_.prompt_tokens(seq); }
  std::int64_t length(std::int64_t seq, int layer, int head) const override { return c_.length(seq, layer, head); }
  std::int64_t total_length(std::int64_t seq) const override { return c_.total_length(seq); }
  HeadContents head_contents(std::int64_t seq, int layer, int head) const override {
    return c_.head_contents(seq, layer, head);
  }
  std::int64_t pages_free() const override { return c_.pages_free(); }
  std::int64_t pages_total() const override { return c_.pages_total(); }
  void append(std::int64_t seq, int layer, View<const float, 3> keys, View<const float, 3> values,
              View<const float, 2> scores, View<const float, 2> gates) override {
    c_.append(seq, layer, keys, values, scores, gates);
  }
  bool takes_step_scores() const override {
    return requires(C& c) { c.set_step_scores(std::int64_t{}, 0, View<const float, 2>{}); };
  }
  void set_step_scores(std::int64_t seq, int layer, View<const float, 2> scores) override {
    if constexpr (requires { c_.set_step_scores(seq, layer, scores); })
      c_.set_step_scores(seq, layer, scores);
    else
      fail("Cache.set_step_scores: this policy's scores are not frozen scores (SPEC §4): give them to append()");
  }
  void attend(std::int64_t seq, int layer, View<const float, 3> queries, View<float, 3> out) override {
    c_.attend(seq, layer, queries, out);
  }
  EvictionReport commit(std::int64_t seq, std::vector<EvictedEntry>* evicted) override { return c_.commit(seq, evicted); }
  void abort_step(std::int64_t seq) override { c_.abort_step(seq); }
  EvictionReport step(const SequenceStep& s, std::vector<EvictedEntry>* evicted) override { return c_.step(s, evicted); }
  std::vector<EvictionReport> step_batch(std::span<const SequenceStep> batch) override { return c_.step_batch(batch); }

 private:
  C c_;
};

/// The storage type of K and V in the pool (the Cache takes and returns fp32 either way).
enum class Storage { float32, float16, bfloat16 };

/// The Cache the registry builds for `selection`, with a pool of `pages` pages of 16 entries.
std::unique_ptr<AnyCache> make_cache(const registry::Selection& selection, const CacheShape& shape, std::int64_t pages,
                                     Storage storage);

namespace detail {
/// One storage type's half of make_cache (make_cache_*.cpp: one translation unit each, compiled in parallel).
template <class T>
std::unique_ptr<AnyCache> make_cache_for(const registry::Selection& selection, const CacheShape& shape, std::int64_t pages) {
  return registry::visit(selection.policy, [&]<registry::Policy P>() -> std::unique_ptr<AnyCache> {
    const registry::Values v = registry::values<P>(selection.given);
    return P::template make<cpu_backend>(v, shape, memory::Paged<16, T>(pages),
                                         [&](auto& cache) -> std::unique_ptr<AnyCache> {
                                           using C = std::decay_t<decltype(cache)>;
                                           return std::make_unique<CacheModel<C>>(std::move(cache));
                                         });
  });
}
std::unique_ptr<AnyCache> make_float32(const registry::Selection&, const CacheShape&, std::int64_t);
std::unique_ptr<AnyCache> make_float16(const registry::Selection&, const CacheShape&, std::int64_t);
std::unique_ptr<AnyCache> make_bfloat16(const registry::Selection&, const CacheShape&, std::int64_t);
}  // namespace detail

}  // namespace kvpolicy::python
