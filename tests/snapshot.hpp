// Everything a cache holds, as bytes, for "a rejected call changes nothing" (SPEC §7): the free
// page count, every slot of the pool (K, V and metadata, live or not), and for each sequence its
// token count and every head's length, block table and live entries. With whole_pool = false the
// slots no live entry uses are left out: that is all a caller can observe, and what a step taken
// back (Cache::abort_step) restores.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace testing {

template <class T>
void put(std::vector<std::uint8_t>& out, const T* p, std::size_t n = 1) {
  const auto* b = reinterpret_cast<const std::uint8_t*>(p);
  out.insert(out.end(), b, b + n * sizeof(T));
}

// Per sequence: whether it exists, its token and prompt counts, then each of its heads as
// put_head(seq, layer, head) writes it.
template <class C, class PutHead>
void put_sequences(std::vector<std::uint8_t>& out, const C& cache, const std::vector<std::int64_t>& seqs,
                   PutHead put_head) {
  const auto& s = cache.shape();
  for (auto seq : seqs) {
    const bool has = cache.has_sequence(seq);
    put(out, &has);
    if (!has) continue;
    const std::int64_t n = cache.tokens(seq), prompt = cache.prompt_tokens(seq);
    put(out, &n);
    put(out, &prompt);
    for (int l = 0; l < s.layers; ++l)
      for (int h = 0; h < s.kv_heads; ++h) put_head(seq, l, h);
  }
}

// What the API shows of a cache whose pool the test cannot read (Cache<cuda_backend>): the free
// pages and, per sequence, its counts and every head's entries as head_contents() reads them back.
template <class C>
std::vector<std::uint8_t> observable_snapshot(const C& cache, const std::vector<std::int64_t>& seqs) {
  std::vector<std::uint8_t> out;
  const std::int64_t free = cache.pages_free();
  put(out, &free);
  put_sequences(out, cache, seqs, [&](std::int64_t seq, int l, int h) {
    const auto head = cache.head_contents(seq, l, h);
    const std::size_t length = head.meta.size();
    put(out, &length);
    put(out, head.meta.data(), length);
    put(out, head.keys.data(), head.keys.size());
    put(out, head.values.data(), head.values.size());
  });
  return out;
}

template <class C>
std::vector<std::uint8_t> pool_snapshot(const C& cache, const std::vector<std::int64_t>& seqs, bool whole_pool) {
  std::vector<std::uint8_t> out;
  const auto& alloc = cache.allocator();
  const auto& pool = alloc.pool();
  const std::int64_t free = alloc.pages_free();
  put(out, &free);
  auto put_slot = [&](std::int64_t slot) {
    put(out, pool.key(slot), static_cast<std::size_t>(pool.head_dim()));
    put(out, pool.value(slot), static_cast<std::size_t>(pool.head_dim()));
    put(out, &pool.meta(slot));
  };
  if (whole_pool)
    for (std::int64_t slot = 0; slot < pool.slots(); ++slot) put_slot(slot);
  put_sequences(out, cache, seqs, [&](std::int64_t seq, int l, int h) {
    const auto head = alloc.layout(seq, l, h);
    put(out, &head.length);
    put(out, head.block_table.data(), head.block_table.size());
    for (std::int64_t i = 0; i < head.length; ++i) put_slot(head.slot(i));
  });
  return out;
}

template <class C>
std::vector<std::uint8_t> snapshot(const C& cache, const std::vector<std::int64_t>& seqs, bool whole_pool = true) {
  if constexpr (requires { cache.allocator().pool(); })
    return pool_snapshot(cache, seqs, whole_pool);
  else
    return observable_snapshot(cache, seqs);
}

}  // namespace testing
