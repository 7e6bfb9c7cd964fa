/// \file
/// kvpolicy/policies/kvzip.hpp — KVzip (Kim et al. 2025, "KVzip: Query-Agnostic KV Cache
/// Compression with Context Reconstruction"; docs/policies.md; SPEC §10 for the probe), as NVIDIA
/// kvpress's KVzipPress runs it: once the prompt is in the cache, the engine runs a probe step
/// that asks the model to repeat it ("Repeat the previous context exactly." and the prompt again);
/// each prompt entry scores the most attention any of the probe's queries of its kv head's group
/// gives it, and at the probe's commit the whole sequence keeps all but floor(N · ratio) of its N
/// prompt entries over every layer and kv head, the lowest scores leaving first and the S oldest
/// positions last. The probe's entries then leave (Cache::open_probe) and decode tokens are never
/// evicted.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/core/by_name.hpp"
#include "kvpolicy/core/record.hpp"
#include "kvpolicy/cpu/backend_fwd.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/memory_bound.hpp"
#include "kvpolicy/inputs/source.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// KVzip's settings, kvpress's defaults: S = 4 sinks, no prefix; the ratio is the fraction of the
/// prompt's entries evicted (kvpress's compression_ratio).
struct KVzipConfig {
  [[no_unique_address]] ByName by_name{};
  double ratio = 0.5;        ///< r in [0, 1): floor(N · r) of the N prompt entries leave
  std::int64_t sinks = 4;    ///< S: positions 0 .. S-1 leave last, and stay in the probe's softmax
  std::int64_t prefix = 0;   ///< P: positions S .. P-1 (a chat template's header) are not scored
};

/// KVzip's score (docs/policies.md): records each layer's queries of a probe step; at its commit, entry t
/// of a head (P <= t < n0, the prompt's length n0) scores max over the probe's queries i and the
/// group's query heads of softmax_j(q_i · k_j / sqrt(d))[t], the softmax over the head's entries at
/// positions < min(S, P) or in [P, n0), and the probe's own up to position n0 + i. Positions below
/// P score 0. Reads the head's keys at a probe's commit only; CPU only.
struct KVzipScorer {
  std::int64_t sinks = 4;
  std::int64_t prefix = 0;

  static constexpr EntryData head_data{.keys = true};
  static constexpr DeviceScoring device_scoring = DeviceScoring::none;

  /// One sequence's probe queries, per layer [Hq, Q, d]; empty outside a probe.
  struct Record {
    int q_heads = 0, head_dim = 0;
    bool probing = false;
    std::vector<std::vector<float>> queries;  // per layer
  };

  void validate() const {
    require(sinks >= 0, "KVzip: sinks S = ", sinks, " must be >= 0");
    require(prefix >= 0, "KVzip: prefix P = ", prefix, " must be >= 0");
  }
  Record open_record(const CacheShape& shape, std::int64_t) const {
    Record r;
    r.q_heads = shape.q_heads;
    r.head_dim = shape.head_dim;
    r.queries.resize(static_cast<std::size_t>(shape.layers));
    return r;
  }
  void open_step(Record& r, std::int64_t) const { r.probing = false; }
  void open_probe(Record& r, std::int64_t) const { r.probing = true; }
  void record_queries(Record& r, int layer, View<const float, 3> queries, std::int64_t) const {
    if (!r.probing) return;
    auto& q = r.queries[static_cast<std::size_t>(layer)];
    q.assign(queries.data, queries.data + queries.size());
  }
  void commit_record(Record& r) const noexcept { forget(r); }
  void discard_record(Record& r, EntryFields) const noexcept { forget(r); }

  bool reads_kv(StepContext c) const { return c.probe > 0; }

  void score_recorded(const Record& r, HeadEntries e, StepContext c, std::span<float> out) const {
    std::fill(out.begin(), out.end(), 0.0f);
    if (c.probe == 0) return;  // only a probe's commit ranks (its Evictor fires nowhere else)
    const std::int64_t n0 = c.n - c.probe, Q = c.probe, d = r.head_dim;
    const std::int64_t sink_end = std::min(sinks, prefix);
    const auto& layer_queries = r.queries[static_cast<std::size_t>(e.layer)];
    require(static_cast<std::int64_t>(layer_queries.size()) == std::int64_t{r.q_heads} * Q * d,
            "KVzip: layer ", e.layer, " of the probe was not attended");
    // the keys the probe's softmax covers, and which of them are scored
    std::vector<std::int64_t> covered;
    for (std::size_t j = 0; j < e.meta.size(); ++j) {
      const std::int64_t p = e.meta[j].position;
      if (p < sink_end || p >= prefix) covered.push_back(static_cast<std::int64_t>(j));
    }
    const std::size_t N = covered.size(), width = static_cast<std::size_t>(d);
    std::vector<float> keys(N * width);  // the covered keys, contiguous
    for (std::size_t j = 0; j < N; ++j)
      for (std::int64_t x = 0; x < d; ++x) keys[j * width + static_cast<std::size_t>(x)] = e.keys(covered[j], x);
    const float sqrt_d = std::sqrt(static_cast<float>(d));
    std::vector<float> p(N);
    for (int g = 0; g < e.group; ++g)
      for (std::int64_t i = 0; i < Q; ++i) {
        const float* q = layer_queries.data() + ((std::int64_t{e.kv_head} * e.group + g) * Q + i) * d;
        const std::int64_t sees_up_to = n0 + i;  // causal inside the probe
        float top = -std::numeric_limits<float>::infinity();
        for (std::size_t j = 0; j < N; ++j) {
          p[j] = -std::numeric_limits<float>::infinity();
          if (e.meta[static_cast<std::size_t>(covered[j])].position > sees_up_to) continue;
          const float* k = &keys[j * width];
          float dot = 0.0f;
          for (std::int64_t x = 0; x < d; ++x) dot += q[x] * k[x];
          p[j] = dot / sqrt_d;
          top = std::max(top, p[j]);
        }
        double sum = 0.0;
        for (float& x : p) sum += x = std::exp(x - top);
        for (std::size_t j = 0; j < N; ++j) {
          const auto at = static_cast<std::size_t>(covered[j]);
          const std::int64_t position = e.meta[at].position;
          if (position >= prefix && position < n0) out[at] = std::max(out[at], static_cast<float>(p[j] / sum));
        }
      }
  }

 private:
  static void forget(Record& r) noexcept {
    r.probing = false;
    for (auto& q : r.queries) std::vector<float>().swap(q);
  }
};

/// KVzip's selection (docs/policies.md): fires at a probe's commit only (every layer and kv head together)
/// and keeps all but floor(N · ratio) of the N prompt entries (positions below the probe's), evicting
/// in ascending order of (score, then (layer, kv head, position)) with the S oldest positions after
/// every other entry, as kvpress's global top-k over the flat (layer, head, position) index evicts.
struct KVzipEvictor {
  double ratio = 0.5;
  std::int64_t sinks = 4;

  static constexpr bool evicts_at_probe = true;

  void validate(const CacheShape& shape) const {
    shape.validate();
    require(ratio >= 0.0 && ratio < 1.0, "KVzip: ratio r = ", ratio, " must be in [0, 1)");
    require(sinks >= 0, "KVzip: sinks S = ", sinks, " must be >= 0");
  }
  std::int64_t group_heads(const CacheShape& shape) const { return shape.heads_total(); }
  /// At a probe's commit; never with r = 0, which evicts nothing (kvpress then scores nothing either).
  KVPOLICY_HD bool fires(std::int64_t, std::int64_t, StepContext c) const { return c.probe > 0 && ratio > 0.0; }
  /// The prompt is compressed once; decode tokens stay.
  std::optional<evict::MemoryBound> memory_bound(const CacheShape&) const { return std::nullopt; }

  void select(const CacheShape&, StepContext c, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    const std::int64_t n0 = c.n - c.probe;
    struct Candidate {
      bool sink;
      float score;
      std::int64_t at;  // index into s: segments in (layer, kv head) order, positions ascending within
    };
    std::vector<Candidate> prompt;
    for (std::int64_t h = 0; h < s.segments(); ++h) {
      const std::size_t before = prompt.size();
      for (std::int64_t at = s.offsets[h]; at < s.offsets[h + 1]; ++at) {
        const std::int32_t position = s.position[static_cast<std::size_t>(at)];
        if (position < n0) prompt.push_back({position < sinks, s.score[static_cast<std::size_t>(at)], at});
      }
      std::sort(prompt.begin() + static_cast<std::ptrdiff_t>(before), prompt.end(),
                [&](const Candidate& a, const Candidate& b) {
                  return s.position[static_cast<std::size_t>(a.at)] < s.position[static_cast<std::size_t>(b.at)];
                });
    }
    const auto evict = static_cast<std::int64_t>(static_cast<double>(prompt.size()) * ratio);
    std::stable_sort(prompt.begin(), prompt.end(), [](const Candidate& a, const Candidate& b) {
      if (a.sink != b.sink) return b.sink;    // sinks last
      return !a.sink && a.score < b.score;  // equal scores (and every sink) keep flat order
    });
    for (std::int64_t i = 0; i < evict; ++i) keep[static_cast<std::size_t>(prompt[static_cast<std::size_t>(i)].at)] = 0;
  }
};

inline KVzipEvictor kvzip_evictor(const KVzipConfig& c = {}) { return KVzipEvictor{c.ratio, c.sinks}; }
inline KVzipScorer kvzip_scorer(const KVzipConfig& c = {}) { return KVzipScorer{c.sinks, c.prefix}; }

/// KVzip's input source (inputs/source.hpp): nothing per token; once the prompt is in the cache the
/// engine runs a probe step asking the model to repeat it (SPEC §10), as Needs::reconstruction
/// describes: P::probe_instruction, then the prompt from position --prefix on.
struct KVzipInputs {
  static constexpr std::string_view name = "reconstruction";
  static constexpr inputs::Scores scores = inputs::Scores::none;
  static constexpr bool probes = true;
  template <class P>
  static inputs::Needs needs(const registry::Values& v) {
    inputs::Needs n;
    n.reconstruction = inputs::ReconstructionProbe{P::probe_instruction, v.integer("prefix")};
    return n;
  }
  template <class P>
  static inputs::Producer producer(const registry::Values& v, const inputs::ModelShape&) {
    return inputs::Producer(needs<P>(v), {}, {}, {});
  }
};

/// KVzip's Cache: after the prompt, open_probe(seq) and step the probe's tokens (SPEC §10); every
/// step attends.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using KVzipCache = Cache<KVzipScorer, admit::All, KVzipEvictor, memory::Paged<PageSize, Storage>, Backend>;

namespace policies {

/// KVzip's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it; the engines run its probe by its
/// input source (KVzipInputs: Needs::reconstruction).
struct kvzip {
  static constexpr std::string_view name = "kvzip";
  static constexpr std::string_view help =
      "KVzip: after the prompt the model repeats it; the sequence keeps the prompt entries that repetition attends to most";
  using Config = KVzipConfig;
  static constexpr std::tuple fields{
      registry::bind(&Config::ratio, registry::Option{"ratio", registry::Kind::real, 0,
                                                      "r, the fraction of the prompt's entries evicted over every layer "
                                                      "and kv head (kvpress's compression_ratio), in [0, 1)"}
                                         .at_least(0, "r")),
      registry::field::sinks<Config>.with_help("S, positions 0 .. S-1, evicted last and in the probe's softmax"),
      registry::bind(&Config::prefix,
                     registry::Option{"prefix", registry::Kind::integer, 0,
                                      "P, the prompt's leading chat-template tokens: positions S .. P-1 are not scored"}
                         .at_least(0, "P"))};
  static constexpr auto options = registry::options_of(fields);
  using inputs = KVzipInputs;
  /// What the probe asks (kvpress's KVzipPress, its first chunk's).
  static constexpr std::string_view probe_instruction = "\n\nRepeat the previous context exactly.";
  using scorers = registry::scorers<KVzipScorer>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    const Config c = registry::read<Config>(v, fields);
    Cache<KVzipScorer, admit::All, KVzipEvictor, Alloc, Backend> cache(shape, std::move(pool), kvzip_evictor(c),
                                                                       kvzip_scorer(c));
    return f(cache);
  }
};

}  // namespace policies

}  // namespace kvpolicy
