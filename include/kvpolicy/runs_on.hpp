/// \file
/// kvpolicy/runs_on.hpp — where a registered policy runs: registry::runs_on<P, Backend>(values).
/// Every policy runs on the CPU (cpu_backend); on the device (cuda_backend) a policy runs when the
/// parts it composes with those values are parts the device runs (cuda/device_parts.hpp, the
/// constants the device executor refuses a composition by). Host code asks without CUDA.
#pragma once

#include <type_traits>

#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/cuda/device_parts.hpp"
#include "kvpolicy/registry.hpp"

namespace kvpolicy {

struct cuda_backend;  // kvpolicy/cuda/backend.cuh; here only its name

namespace registry {

/// Whether policy P with the option values `v` runs on Backend (cpu_backend or cuda_backend). The
/// composition can depend on the values (WG-KV with a hard budget runs on the CPU only); a value
/// the policy refuses throws, naming it.
template <Policy P, class Backend>
bool runs_on(const Values& v) {
  static_assert(std::is_same_v<Backend, cpu_backend> || std::is_same_v<Backend, cuda_backend>,
                "registry::runs_on: the backends are cpu_backend and cuda_backend");
  if constexpr (std::is_same_v<Backend, cpu_backend>) {
    return true;
  } else {
    bool runs = false;  // the parts, from a CPU Cache of one page (what is composed is what is asked)
    P::template make<cpu_backend>(v, CacheShape{1, 1, 1, 16}, memory::Paged<16>(1), [&](auto& cache) {
      using C = std::decay_t<decltype(cache)>;
      runs = gpu::device_runs<typename C::scorer_type, typename C::admitter_type, std::decay_t<decltype(cache.evictor())>>;
    });
    return runs;
  }
}

/// runs_on with the policy's defaults.
template <Policy P, class Backend>
bool runs_on() {
  return runs_on<P, Backend>(values<P>({}));
}

}  // namespace registry
}  // namespace kvpolicy
