/// \file
/// kvpolicy/core/record.hpp — what a Scorer that records across steps is handed (the hooks it
/// declares: core/concepts.hpp, RecordingScorer): the entries' fields its hooks may change
/// (EntryFields), one head's entries as it scores them (HeadEntries), which of their K/V it reads
/// (EntryData), and how the device scores it (DeviceScoring).
#pragma once

#include <cstdint>
#include <span>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/view.hpp"

namespace kvpolicy {

/// The metadata of a pool's entries by slot, as a recording Scorer's hooks change their fields:
/// H2O adds each key's attention probability to Field::attention_mass as the attention runs, and
/// puts back what the open step added when the step is taken back (SPEC §5, §7). Empty where the
/// pool's metadata cannot be changed from the host (the device's).
struct EntryFields {
  std::span<EntryMeta> meta;  ///< indexed by slot
  float& operator()(std::int64_t slot, Field f) const { return field_of(meta[static_cast<std::size_t>(slot)], f); }
};

/// Which of a head's K/V a Scorer that scores from its record reads (`static constexpr EntryData
/// head_data`; none when it declares none): the planner converts them to fp32 for it.
struct EntryData {
  bool keys = false;
  bool values = false;
};

/// One head's entries as a Scorer scores them from its record: their metadata, their keys and
/// values in fp32 ([N, d], storage order as the metadata; empty where the Scorer does not read
/// them, or where its reads_kv(ctx) said this step does not need them), and which head they are
/// (its layer, kv head, and the GQA group size G of its query heads kv_head·G .. kv_head·G + G - 1).
struct HeadEntries {
  std::span<const EntryMeta> meta;
  View<const float, 2> keys;
  View<const float, 2> values;
  int layer = 0;
  int kv_head = 0;
  int group = 1;
};

/// How the device Cache (cuda_backend) scores a Scorer's entries, as the Scorer declares it
/// (`static constexpr DeviceScoring device_scoring`): by_entry, its KVPOLICY_HD operator() in the
/// scoring kernel; observed_attention, the observed-attention kernel over the last queries it records
/// (score::ObservedAttention's, SPEC §5); none, the device refuses it. Where it declares nothing:
/// by_entry for an EntryScorer that records nothing, none otherwise (cuda/device_parts.hpp).
enum class DeviceScoring : std::uint8_t { none, by_entry, observed_attention };

}  // namespace kvpolicy
