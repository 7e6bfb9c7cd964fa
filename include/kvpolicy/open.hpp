/// \file
/// kvpolicy/open.hpp — the run-time door: a policy's name and options (registry::Selection)
/// become its Cache behind AnyCache, over a pool of memory::Paged<16, Storage> pages on the CPU,
/// and the producer of its inputs for the model (inputs/producer.hpp). The one place a name turns
/// into a Cache; what a policy can do without building one is registry.hpp's (over_engine_storage,
/// takes, needs_prompt_length). kvpolicy-lm (and its --tp path), kvpolicy-llama, kvpolicy-replay and
/// the Python module all open their policies here.
///
/// Each call instantiates every registered policy's Cache for the storage type it names. A program
/// that chooses the type at run time dispatches with with_kv_storage, or splits the types over
/// translation units (the Python module does).
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "kvpolicy/any_cache.hpp"
#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/inputs/producer.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/registry.hpp"

namespace kvpolicy {

/// How a pool holds K and V (the Cache takes and returns fp32 either way), or that the engine
/// holds them and the pool keeps each entry's metadata alone (engine_owned, SPEC §9).
enum class KvStorage { float32, float16, bfloat16, engine_owned };

/// f(std::type_identity<T>{}) with the storage type T that `storage` names.
template <class F>
decltype(auto) with_kv_storage(KvStorage storage, F&& f) {
  switch (storage) {
    case KvStorage::float16: return f(std::type_identity<half>{});
    case KvStorage::bfloat16: return f(std::type_identity<bfloat16>{});
    case KvStorage::engine_owned: return f(std::type_identity<engine_owned>{});
    case KvStorage::float32: break;
  }
  return f(std::type_identity<float>{});
}

}  // namespace kvpolicy

namespace kvpolicy::registry {

/// Entries per page of the pools the door builds (memory::Paged's PageSize).
inline constexpr std::int64_t page_entries = 16;

/// A policy's Cache and the producer of what its entries need from the forward pass.
struct Opened {
  std::unique_ptr<AnyCache> cache;
  inputs::Producer inputs;
};

namespace detail {
/// make.template operator()<P>(values) for the policy `selection` names, its options checked
/// (values<P>); over engine-owned storage a policy that cannot run so (registry::over_engine_storage)
/// is refused by name.
template <class Storage, class Make>
std::unique_ptr<AnyCache> build(const Selection& selection, Make&& make) {
  return visit(selection.policy, [&]<Policy P>() -> std::unique_ptr<AnyCache> {
    if constexpr (!stores_kv_v<Storage> && !over_engine_storage<P>()) {
      fail("policy ", P::name, refuses_engine_storage_v<P> ? " masks the attention or drops tokens at write time"
                                                            : " reads the values of stored entries",
           ", which an engine attending over its own K/V does not give (SPEC §9); policies over the engine's K/V: ",
           over_engine_storage_policies());
    } else {
      return make.template operator()<P>(values<P>(selection.given));
    }
  });
}

template <class C>
std::unique_ptr<AnyCache> erased(C& cache) {
  return std::make_unique<AnyCacheOf<C>>(std::move(cache));
}
}  // namespace detail

/// The Cache `selection` names for `shape`, over a pool of `pages` pages of K/V stored as Storage
/// (engine_owned: none, SPEC §9). An unknown name, an option the policy does not take, a bad value
/// or a refused composition is an error that names it. Over engine-owned storage a policy that
/// cannot run so is refused by name, with the list of the policies that do; one that reads keys
/// needs the engine's (AnyCache::use_engine_keys) before its first step.
template <class Storage = float>
std::unique_ptr<AnyCache> open_cache(const Selection& selection, const CacheShape& shape, std::int64_t pages) {
  return detail::build<Storage>(selection, [&]<Policy P>(const Values& v) {
    return P::template make<cpu_backend>(v, shape, memory::Paged<page_entries, Storage>(pages),
                                         [](auto& cache) { return detail::erased(cache); });
  });
}

/// The explicit instantiation of open_cache for one storage type: `extern` before it declares it
/// (the Caches it builds are then not compiled in that translation unit), alone it defines it.
#define KVPOLICY_OPEN_CACHE_INSTANCE(Storage) \
  template std::unique_ptr<AnyCache> open_cache<Storage>(const Selection&, const CacheShape&, std::int64_t)

// open_cache compiles every registered policy's Cache for its storage type, most of the compile time
// of a file that opens a policy by name: a program that defines KVPOLICY_EXTERN_OPEN_CACHE in every
// translation unit declares it here for the storage types a CPU engine stores (float, half) and
// engine_owned, and defines each in exactly one unit with KVPOLICY_OPEN_CACHE_INSTANCE, built with
// the same flags (OpenMP included: core/parallel.hpp). bfloat16 compiles where it is used. Without
// the macro nothing changes: the library stays header-only.
#if defined(KVPOLICY_EXTERN_OPEN_CACHE)
extern KVPOLICY_OPEN_CACHE_INSTANCE(float);
extern KVPOLICY_OPEN_CACHE_INSTANCE(half);
extern KVPOLICY_OPEN_CACHE_INSTANCE(engine_owned);
#endif

/// The options of the policy `selection` names, checked as open_cache checks them (values<P>): an
/// unknown name, an option the policy does not take or a value that does not parse is an error
/// naming it. Nothing is built.
inline void check_options(const Selection& selection) {
  visit(selection.policy, [&]<Policy P>() { (void)values<P>(selection.given); });
}

/// What the policy `selection` names reads from the forward pass (inputs::needs); nothing is built.
inline inputs::Needs input_needs(const Selection& selection) {
  return visit(selection.policy, [&]<Policy P>() { return inputs::needs<P>(values<P>(selection.given)); });
}

/// A policy's input source as its type states it (inputs/source.hpp); nothing is built.
struct InputSource {
  std::string_view name;                         ///< as a tool prints it ("retention_gate", ...)
  inputs::Scores scores = inputs::Scores::none;  ///< what its producer writes for each entry
  bool gated = false;                            ///< it reads the file --gate gives
  bool probes = false;                           ///< the engine runs a probe step after the prompt (SPEC §10)
};

/// The input source of the policy named `policy` (an unknown name is an error naming the known ones).
inline InputSource input_source(std::string_view policy) {
  return visit(policy, [&]<Policy P>() {
    using I = typename P::inputs;
    return InputSource{I::name, I::scores, inputs::gated_v<I>, inputs::probes_v<I>};
  });
}

/// Writes to `path` an example of the file the policy's --gate takes, of `model`'s shapes (its
/// source's example_gate: small random weights, every readout bias `level` where the file has one;
/// a large level keeps every entry, a very negative one drops every entry the policy may drop).
/// What the tests run a gated policy with, whichever it is. Refused for a policy whose source
/// reads no file.
inline void example_gate(std::string_view policy, const std::string& path, const inputs::ModelShape& model, float level) {
  visit(policy, [&]<Policy P>() { inputs::example_gate<P>(path, model, level); });
}

/// The producer of the inputs of the policy `selection` names, for `model` (inputs::producer).
inline inputs::Producer open_inputs(const Selection& selection, const inputs::ModelShape& model) {
  return visit(selection.policy,
               [&]<Policy P>() { return inputs::producer<P>(values<P>(selection.given), model); });
}

/// The policy's Cache for model.cache over `pages` pages, and the producer of its inputs (made
/// first: a missing gate file or a bad band is refused before the pool is allocated).
template <class Storage = float>
Opened open(const Selection& selection, const inputs::ModelShape& model, std::int64_t pages) {
  inputs::Producer producer = open_inputs(selection, model);
  return {open_cache<Storage>(selection, model.cache, pages), std::move(producer)};
}

}  // namespace kvpolicy::registry
