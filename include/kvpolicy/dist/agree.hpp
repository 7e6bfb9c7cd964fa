/// \file
/// kvpolicy/dist/agree.hpp — the library's "a failed call changes nothing" across the ranks of a
/// tensor-parallel group: before a sharded step writes anything, every rank checks its own share
/// (Cache::check_step), and the ranks agree. If any rank refuses, every rank throws the same
/// kvpolicy::Error — the refusal of the lowest refusing rank, with its rank — and no rank has
/// changed anything. Otherwise every rank steps, and the step's collectives (dist::Sharded) meet.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/dist/communicator.hpp"

namespace kvpolicy::dist {

/// Runs `check` on this rank; if it throws kvpolicy::Error on any rank, every rank throws
/// "rank R refused: <R's message>" (R the lowest refusing rank). Collective: one all-reduce of a
/// flag per rank; when a rank refused, a broadcast of its message (up to 1,024 bytes) too.
template <Communicator C, class Check>
void agree(C& comm, Check&& check) {
  std::string mine;
  bool refused = false;
  try {
    check();
  } catch (const Error& e) {
    refused = true;
    mine = e.what();
  }
  // the lowest refusing rank: each rank marks its own slot
  std::vector<std::int64_t> who(static_cast<std::size_t>(comm.size()), 0);
  who[static_cast<std::size_t>(comm.rank())] = refused ? 1 : 0;
  comm.all_reduce_sum(who);
  const auto first = std::find(who.begin(), who.end(), std::int64_t{1});
  if (first == who.end()) return;
  const int r = static_cast<int>(first - who.begin());
  // its message, 8 bytes to an int64, broadcast from it
  constexpr std::size_t limit = 1024;
  std::vector<std::int64_t> text(limit / 8, 0);
  if (comm.rank() == r) {
    const std::string prefix = "kvpolicy: ";  // Error adds it again
    const std::string body = mine.rfind(prefix, 0) == 0 ? mine.substr(prefix.size()) : mine;
    for (std::size_t i = 0; i < std::min(body.size(), limit - 1); ++i)
      text[i / 8] |= static_cast<std::int64_t>(static_cast<unsigned char>(body[i])) << (8 * (i % 8));
  }
  comm.broadcast(text, r);
  std::string message;
  for (std::size_t i = 0; i < limit; ++i) {
    const char c = static_cast<char>((text[i / 8] >> (8 * (i % 8))) & 0xff);
    if (c == '\0') break;
    message += c;
  }
  fail("rank ", r, " refused: ", message);
}

/// One sharded Cache step that every rank takes or none does (dist::Sharded's collectives then
/// meet): agree on cache.check_step(s), then cache.step(s, evicted). Collective.
template <Communicator C, class CacheT, class Step, class Evicted>
auto step(C& comm, CacheT& cache, const Step& s, Evicted* evicted) {
  agree(comm, [&] { cache.check_step(s); });
  return cache.step(s, evicted);
}

}  // namespace kvpolicy::dist
