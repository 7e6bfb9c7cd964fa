/// \file
/// kvpolicy/inputs/sources.hpp — the input sources several policies share (inputs/source.hpp says
/// what a source is). Their producers, and the example gates of the gated ones, are defined in
/// inputs/producer.hpp, which an engine includes; a policy file includes this one only.
///   None               nothing: the score comes from the cache itself
///   RetentionGate      log beta from TRIM-KV's gate on the layer's normed input (SPEC §1)
///   TiedRetentionGate  log beta from DBTrimKV's tied gate (rg10, or the paper's; SPEC §2)
///   WriteGate          g from WG-KV's write gate on the keys before and after RoPE (SPEC §3)
///   KeyValueStatistic  a rolling statistic of each sequence's keys and values (SPEC §4; P::statistic)
///   HiddenStates       one score per token from two hidden-state bands (SPEC §4; P::variant)
#pragma once

#include <array>
#include <string_view>

#include "kvpolicy/inputs/source.hpp"

namespace kvpolicy::inputs {

/// Reads nothing: the entries' scores come from the cache itself (position, keys, attention).
struct None {
  static constexpr std::string_view name = "none";
  static constexpr Scores scores = Scores::none;
  template <class P>
  static Needs needs(const registry::Values&) {
    return {};
  }
  template <class P>
  static Producer producer(const registry::Values&, const ModelShape&) {
    return {};
  }
};

/// TRIM-KV's retention gate on the layer's normed input: log beta per kv head (SPEC §1).
struct RetentionGate {
  static constexpr std::string_view name = "retention_gate";
  static constexpr Scores scores = Scores::log_beta;
  static constexpr bool gated = true;
  template <class P>
  static Needs needs(const registry::Values& v);
  template <class P>
  static Producer producer(const registry::Values& v, const ModelShape& model);
  static void example_gate(const GateSink& add, const ModelShape& model, float level);
};

/// DBTrimKV's tied gate (the authors' rg10, or the paper's literal one): log beta (SPEC §2).
struct TiedRetentionGate {
  static constexpr std::string_view name = "tied_retention_gate";
  static constexpr Scores scores = Scores::log_beta;
  static constexpr bool gated = true;
  template <class P>
  static Needs needs(const registry::Values& v);
  template <class P>
  static Producer producer(const registry::Values& v, const ModelShape& model);
  static void example_gate(const GateSink& add, const ModelShape& model, float level);
};

/// WG-KV's write gate on the keys before and after RoPE: g in [0, 1] (SPEC §3).
struct WriteGate {
  static constexpr std::string_view name = "write_gate";
  static constexpr Scores scores = Scores::gate;
  static constexpr bool gated = true;
  template <class P>
  static Needs needs(const registry::Values& v);
  template <class P>
  static Producer producer(const registry::Values& v, const ModelShape& model);
  static void example_gate(const GateSink& add, const ModelShape& model, float level);
};

/// A rolling statistic of each sequence's keys and values, P::statistic (SPEC §4).
struct KeyValueStatistic {
  static constexpr std::string_view name = "key_value_statistic";
  static constexpr Scores scores = Scores::score;
  template <class P>
  static Needs needs(const registry::Values&) {
    Needs n;
    n.keys = n.values = true;
    return n;
  }
  template <class P>
  static Producer producer(const registry::Values& v, const ModelShape& model);
};

/// One score per token from the hidden states of two bands, P::variant (SPEC §4).
struct HiddenStates {
  static constexpr std::string_view name = "hidden_states";
  static constexpr Scores scores = Scores::score;
  template <class P>
  static Needs needs(const registry::Values& v) {
    Needs n;
    n.bands = std::array{static_cast<int>(v.integer("band-a")), static_cast<int>(v.integer("band-b"))};
    return n;
  }
  template <class P>
  static Producer producer(const registry::Values& v, const ModelShape& model);
};

}  // namespace kvpolicy::inputs
