// What a sequence's cache holds at the end of a run, as one digest two runs compare (kvpolicy-lm
// unsharded against --tp, kvpolicy-llama against kvpolicy-lm --mode union): per (layer, kv head) an
// FNV-1a hash of its entries' positions in stored order, then one FNV-1a hash of those, in hex.
// The same digest is the same survivors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"

namespace kvpolicy::apps {

/// The hash of head (l, h)'s positions in stored order (kept to 62 bits: summed over ranks in int64).
template <class CacheT>
std::int64_t head_digest(const CacheT& cache, std::int64_t seq, int l, int h) {
  std::uint64_t x = 1469598103934665603ull;
  for (std::int64_t i = 0; i < cache.length(seq, l, h); ++i) {
    x ^= static_cast<std::uint64_t>(cache.entry(seq, l, h, i).position);
    x *= 1099511628211ull;
  }
  return static_cast<std::int64_t>(x >> 2);
}

/// Every head's digest, (layer, kv head) order.
template <class CacheT>
std::vector<std::int64_t> head_digests(const CacheT& cache, std::int64_t seq) {
  std::vector<std::int64_t> out;
  for (int l = 0; l < cache.shape().layers; ++l)
    for (int h = 0; h < cache.shape().kv_heads; ++h) out.push_back(head_digest(cache, seq, l, h));
  return out;
}

/// One hash of the heads' digests, in hex: what a run prints as `survivors <digest>`.
inline std::string digest_text(const std::vector<std::int64_t>& digest) {
  std::uint64_t x = 1469598103934665603ull;
  for (const std::int64_t d : digest) x = (x ^ static_cast<std::uint64_t>(d)) * 1099511628211ull;
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(x));
  return text;
}

/// Writes one line per (layer, kv head) of `shape`: `layer head p p ...`, the positions
/// `positions(l, h)` gives, sorted (a run's --survivors FILE: two engines' files compared position by
/// position).
template <class Positions>
void write_position_lines(const CacheShape& shape, Positions&& positions, const std::string& path) {
  std::ofstream out(path);
  require(out.good(), "--survivors: cannot write '", path, "'");
  for (int l = 0; l < shape.layers; ++l)
    for (int h = 0; h < shape.kv_heads; ++h) {
      std::vector<std::int32_t> p = positions(l, h);
      std::sort(p.begin(), p.end());
      out << l << ' ' << h;
      for (const std::int32_t x : p) out << ' ' << x;
      out << '\n';
    }
  require(out.good(), "--survivors: writing '", path, "' failed");
}

/// What every (layer, kv head) of the cache holds, as write_position_lines writes it.
template <class CacheT>
void write_positions(const CacheT& cache, std::int64_t seq, const std::string& path) {
  write_position_lines(
      cache.shape(),
      [&](int l, int h) {
        std::vector<std::int32_t> p;
        for (std::int64_t i = 0; i < cache.length(seq, l, h); ++i) p.push_back(cache.entry(seq, l, h, i).position);
        return p;
      },
      path);
}

}  // namespace kvpolicy::apps
