/// \file
/// kvpolicy/policies/kvzap.hpp — KVzap (SPEC §11), as NVIDIA kvpress 0.5.5's DMSPress(KVzapPress)
/// runs it: a small model per layer (gate/surrogate.hpp) reads each token's attention input when
/// it is written and predicts the log of the KVzip+ score its entry would get in each kv head; that
/// score is frozen in the entry, and after every step each (layer, kv head) drops its entries
/// scoring below tau, except its W newest. No budget: what stays depends on the text.
///
///   kvpolicy::KVzapCache<> cache(shape, kvpolicy::memory::Paged<16>(pages), kvpolicy::kvzap_evictor({.tau = -3.5}));
///   surrogate.forward(layer, normed_input /* [T, D] */, scores /* [Hkv, T] */);   // per layer
///   cache.step(seq, keys, values, scores /* [L, Hkv, T], in place of log_beta */);
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/core/by_name.hpp"
#include "kvpolicy/core/rule.hpp"
#include "kvpolicy/cpu/backend_fwd.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/memory_bound.hpp"
#include "kvpolicy/parts/score/retention.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// KVzap's settings: tau on the predicted log score, and kvpress's window of 128 tokens.
struct KVzapConfig {
  [[no_unique_address]] ByName by_name{};
  double tau = -4.0;           ///< an entry past the window leaves when its score is < tau (kvpress's example)
  std::int64_t window = 128;   ///< W: the W newest entries of each head stay whatever their score
};

/// KVzap's rule (SPEC §11) on a head's entries, with the surrogate's score frozen in each: after
/// every step a head longer than W keeps its W newest entries and every older one scoring >= tau.
/// Every token is written to every head and none of the W newest leaves, so a head's W newest are
/// the sequence's last W positions: kvpress's rule (masked once t < N - W and s < tau) exactly.
struct KVzapEvictor {
  double tau = -4.0;
  std::int64_t window = 128;

  void validate(const CacheShape& shape) const {
    shape.validate();
    require(std::isfinite(tau) && std::fabs(tau) <= 1e30, "KVzap: tau = ", tau, " must be finite and within fp32's range");
    require(window >= 0 && window <= INT32_MAX, "KVzap: window W = ", window, " must be in [0, 2^31 - 1]");
  }
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext) const { return length > window; }
  /// No budget bounds a head: every entry scoring >= tau stays.
  std::optional<evict::MemoryBound> memory_bound(const CacheShape&) const { return std::nullopt; }
  /// kvpress compares the fp32 score with tau in fp32 (`scores < threshold` on a float tensor).
  evict::HeadSelection selection() const {
    evict::HeadSelection sel;
    sel.threshold = true;
    sel.bound = static_cast<float>(tau);
    sel.window = window;
    return sel;
  }
};

inline KVzapEvictor kvzap_evictor(const KVzapConfig& c = {}) { return KVzapEvictor{c.tau, c.window}; }

/// KVzap's Cache: the surrogate's scores in place of log_beta at every step (score::Frozen).
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using KVzapCache = Cache<score::Frozen, admit::All, KVzapEvictor, memory::Paged<PageSize, Storage>, Backend>;

namespace policies {

/// KVzap's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it; the engines compute its scores by
/// its inputs (registry::Inputs::surrogate, the file given as --gate).
struct kvzap {
  static constexpr std::string_view name = "kvzap";
  static constexpr std::string_view help =
      "KVzap: a small model on each token's normed input predicts its KVzip score; past the window, entries below tau leave";
  using Config = KVzapConfig;
  static constexpr std::tuple fields{
      registry::bind(&Config::tau, registry::Option{"tau", registry::Kind::real, 0,
                                                    "tau: an entry past the window leaves when its predicted log score is < tau"}),
      registry::field::window<Config>.with_help("W, the newest entries of every head, kept whatever their score")};
  static constexpr auto options = registry::options_of(
      fields, registry::option::gate.with_help("KVzap's surrogate, a safetensors file under kvpress's KVzapModel names"));
  static constexpr registry::Inputs inputs = registry::Inputs::surrogate;
  using scorers = registry::scorers<score::Frozen>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    Cache<score::Frozen, admit::All, KVzapEvictor, Alloc, Backend> cache(shape, std::move(pool),
                                                                         kvzap_evictor(registry::read<Config>(v, fields)));
    return f(cache);
  }
};

}  // namespace policies

}  // namespace kvpolicy
