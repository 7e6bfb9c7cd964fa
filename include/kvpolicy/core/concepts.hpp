/// \file
/// kvpolicy/core/concepts.hpp — the four concepts a Cache is composed of (DESIGN, "The four concepts").
/// Every policy static_asserts the concept it models, so a wrong composition fails to compile with
/// one readable line.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/shape.hpp"

namespace kvpolicy {

/// Scorer: entry metadata + step context -> one fp32 score, higher = keep. Pure KVPOLICY_HD math.
template <class S>
concept Scorer = std::copyable<S> && requires(const S& s, EntryMeta m, StepContext c) {
  { s(m, c) } -> std::same_as<float>;
  { S::needs_key_norm } -> std::convertible_to<bool>;
  s.validate();
};

/// Admitter: decides at write time where a new entry goes.
template <class A>
concept Admitter = std::copyable<A> && requires(const A& a, EntryMeta m) {
  { a.admit(m) } -> std::same_as<Admission>;
};

/// Evictor: a trigger over per-head lengths, then a selection over segmented scores that marks the
/// survivors. It never moves data.
///   trigger(shape, lengths, active): lengths has one entry per (layer, kv head); marks in `active`
///     the heads whose entries take part in this eviction and returns whether any does.
///   select(shape, scores, keep): for the active heads' segments, sets keep[i] = 1 for survivors.
template <class E>
concept Evictor = std::copyable<E> &&
    requires(const E& e, const CacheShape& shape, std::span<const std::int64_t> lengths,
             std::span<std::uint8_t> active, const SegmentedScores& scores, std::span<std::uint8_t> keep) {
      e.validate(shape);
      { e.trigger(shape, lengths, active) } -> std::same_as<bool>;
      e.select(shape, scores, keep);
    };

/// Allocator: owns where entries live. Appends whole steps of a head, reads them back through
/// block tables, and compacts a head to its survivors, returning emptied pages to the pool.
template <class A>
concept Allocator = requires(A& a, const A& ca, const CacheShape& shape, std::int64_t seq, int layer,
                             int head, std::span<const std::uint8_t> keep) {
  typename A::storage_type;
  a.bind(shape);
  a.add_sequence(seq);
  a.remove_sequence(seq);
  { ca.has_sequence(seq) } -> std::same_as<bool>;
  { ca.length(seq, layer, head) } -> std::same_as<std::int64_t>;
  { ca.can_append(seq, std::int64_t{1}) } -> std::same_as<bool>;
  { ca.can_append(seq, std::int64_t{1}, layer) } -> std::same_as<bool>;
  a.append(seq, layer, head, std::int64_t{1}, static_cast<const float*>(nullptr), static_cast<const float*>(nullptr),
           static_cast<const EntryMeta*>(nullptr));
  ca.layout(seq, layer, head);  // a memory::HeadLayout: block table, page size, length
  ca.pool();                    // the memory::EntryPool the layouts index
  { a.compact(seq, layer, head, keep) } -> std::same_as<std::int64_t>;
  { ca.pages_free() } -> std::convertible_to<std::int64_t>;
  { ca.pages_total() } -> std::convertible_to<std::int64_t>;
};

}  // namespace kvpolicy
