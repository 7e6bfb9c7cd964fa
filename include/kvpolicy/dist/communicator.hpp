/// \file
/// kvpolicy/dist/communicator.hpp — what a sharded cache needs from the engine's tensor-parallel
/// group: its rank, its size, an all-reduce (sum) of small int64 arrays (the selection's counts)
/// and of float arrays (a Megatron-split model's partial products, apps/lm), and a broadcast of
/// either from one rank (a refusing rank's message, dist/agree.hpp). The engine hands in
/// the communicator of the group it already has (dist/mpi.hpp wraps an MPI communicator); kvpolicy
/// never creates processes or transports. A failed collective throws kvpolicy::Error naming the rank.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>

#include "kvpolicy/core/error.hpp"

namespace kvpolicy::dist {

/// What a sharded cache calls on the engine's tensor-parallel group: its rank and size, sums and broadcasts
/// over every rank.
template <class C>
concept Communicator = requires(C& c, const C& cc, std::span<std::int64_t> counts, std::span<float> values) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.all_reduce_sum(counts);  ///< every rank's values summed, in place, on every rank
  c.all_reduce_sum(values);  ///< the same in fp32 (the sum's order is the runtime's)
  c.broadcast(counts, 0);    ///< rank root's values, in place, on every rank
  c.broadcast(values, 0);
};

/// One rank: the unsharded cache's group, where every collective is the identity.
struct Local {
  int rank() const { return 0; }
  int size() const { return 1; }
  void all_reduce_sum(std::span<std::int64_t>) {}
  void all_reduce_sum(std::span<float>) {}
  void broadcast(std::span<std::int64_t>, int) {}
  void broadcast(std::span<float>, int) {}
};

/// A communicator that counts what passes through another: the round trips (collectives) and the
/// bytes each rank contributes, for the cost docs/distributed.md reports.
template <Communicator C>
struct Counted {
  C& inner;
  std::int64_t round_trips = 0;
  std::int64_t bytes = 0;

  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  void all_reduce_sum(std::span<std::int64_t> values) { count(values.size_bytes()), inner.all_reduce_sum(values); }
  void all_reduce_sum(std::span<float> values) { count(values.size_bytes()), inner.all_reduce_sum(values); }
  void broadcast(std::span<std::int64_t> values, int root) { count(values.size_bytes()), inner.broadcast(values, root); }
  void broadcast(std::span<float> values, int root) { count(values.size_bytes()), inner.broadcast(values, root); }

 private:
  void count(std::size_t b) {
    ++round_trips;
    bytes += static_cast<std::int64_t>(b);
  }
};

static_assert(Communicator<Local> && Communicator<Counted<Local>>, "the built-in communicators");

}  // namespace kvpolicy::dist
