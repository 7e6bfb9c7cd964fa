// A Scorer that reads Field::attention_mass and records none (no record_mass hook): nothing would
// add to the field, so the Cache refuses it with a one-line reason. Compiled by the ctest entries
// composition_mass_unrecorded with -fsyntax-only; KVPOLICY_CONTROL=1 is the control that the same
// composition compiles with score::AttentionMass, which records it.
#include "kvpolicy/baselines.hpp"

struct MassReader {
  static constexpr kvpolicy::FieldSet entry_fields{kvpolicy::Field::attention_mass};
  void validate() const {}
  float operator()(kvpolicy::EntryMeta m, kvpolicy::StepContext) const { return m.attention_mass; }
};

#if KVPOLICY_CONTROL
using Scorer = kvpolicy::score::AttentionMass;
#else
using Scorer = MassReader;
#endif

int main() {
  kvpolicy::Cache<Scorer, kvpolicy::admit::All, kvpolicy::evict::PerHead<>, kvpolicy::memory::Paged<16>,
                  kvpolicy::cpu_backend>
      cache(kvpolicy::CacheShape{1, 1, 1, 4}, kvpolicy::memory::Paged<16>(4));
  return cache.has_sequence(0) ? 1 : 0;
}
