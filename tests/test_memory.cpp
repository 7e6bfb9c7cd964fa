// memory/: the paged and contiguous allocators — page accounting, block tables, hole-filling
// compaction, several sequences in one pool, out-of-pages errors that change nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kvpolicy/memory/contiguous.hpp"
#include "kvpolicy/memory/paged.hpp"

using namespace kvpolicy;

namespace {

std::vector<EntryMeta> metas(std::int32_t first, std::int64_t n) {
  std::vector<EntryMeta> m;
  for (std::int64_t i = 0; i < n; ++i) m.push_back({static_cast<std::int32_t>(first + i), -0.1f * static_cast<float>(i), 1.0f});
  return m;
}
// keys/values whose first component is the position, so moved data can be traced.
std::vector<float> rows(std::int32_t first, std::int64_t n, int d, float sign = 1.0f) {
  std::vector<float> r(static_cast<std::size_t>(n * d));
  for (std::int64_t i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) r[static_cast<std::size_t>(i * d + c)] = sign * static_cast<float>(first + i) + 0.01f * c;
  return r;
}

template <class A>
void append_tokens(A& a, std::int64_t seq, int layer, int head, std::int32_t first, std::int64_t n, int d) {
  const auto k = rows(first, n, d), v = rows(first, n, d, -1.0f);
  const auto m = metas(first, n);
  a.append(seq, layer, head, n, k.data(), v.data(), m.data());
}

}  // namespace

TEST_CASE("paged: block tables, ragged lengths, pages conserved across sequences") {
  const CacheShape shape{2, 2, 2, 3};
  memory::Paged<4> a(20);
  a.bind(shape);
  a.add_sequence(1);
  a.add_sequence(2);
  append_tokens(a, 1, 0, 0, 0, 9, 3);  // 3 pages
  append_tokens(a, 1, 1, 1, 0, 4, 3);  // 1 page
  append_tokens(a, 2, 0, 1, 0, 1, 3);  // 1 page
  CHECK(a.length(1, 0, 0) == 9);
  CHECK(a.length(1, 0, 1) == 0);
  CHECK(a.pages_used(1) == 4);
  CHECK(a.pages_used(2) == 1);
  CHECK(a.pages_free() == 15);
  const auto head = a.layout(1, 0, 0);
  CHECK(head.block_table.size() == 3);
  for (std::int64_t i = 0; i < 9; ++i) {
    CHECK(a.pool().meta(head.slot(i)).position == i);
    CHECK(to_float(a.pool().key(head.slot(i))[0]) == static_cast<float>(i));
  }
  a.remove_sequence(1);
  CHECK(a.pages_free() == 19);
  CHECK_THROWS_WITH_AS(a.length(1, 0, 0), doctest::Contains("unknown sequence 1"), Error);
  CHECK_THROWS_WITH_AS(a.add_sequence(2), doctest::Contains("sequence 2 already exists"), Error);
  CHECK_THROWS_WITH_AS(a.length(2, 2, 0), doctest::Contains("layer 2 out of range"), Error);
}

TEST_CASE("paged: running out of pages is a clear error that changes nothing") {
  const CacheShape shape{1, 1, 1, 2};
  memory::Paged<4> a(2);
  a.bind(shape);
  a.add_sequence(0);
  append_tokens(a, 0, 0, 0, 0, 6, 2);
  const auto before = a.layout(0, 0, 0);
  const std::vector<std::int32_t> table(before.block_table.begin(), before.block_table.end());
  CHECK_FALSE(a.can_append(0, 3));
  CHECK_THROWS_WITH_AS(append_tokens(a, 0, 0, 0, 6, 3, 2), doctest::Contains("out of pages"), Error);
  CHECK(a.length(0, 0, 0) == 6);
  CHECK(a.pages_free() == 0);
  const auto after = a.layout(0, 0, 0);
  CHECK(std::vector<std::int32_t>(after.block_table.begin(), after.block_table.end()) == table);
  append_tokens(a, 0, 0, 0, 6, 2, 2);  // exactly fills the pool
  CHECK(a.length(0, 0, 0) == 8);
}

TEST_CASE("compaction fills holes from above, moves O(evicted), frees emptied pages") {
  const CacheShape shape{1, 1, 1, 2};
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    memory::Paged<3> a(40);
    a.bind(shape);
    a.add_sequence(0);
    const auto n = std::uniform_int_distribution<std::int64_t>(1, 60)(rng);
    append_tokens(a, 0, 0, 0, 0, n, 2);
    std::vector<std::uint8_t> keep(static_cast<std::size_t>(n));
    std::int64_t kept = 0;
    for (auto& k : keep) kept += (k = std::bernoulli_distribution(0.4)(rng) ? 1 : 0);
    CHECK(a.compact(0, 0, 0, keep) == n - kept);
    CHECK(a.length(0, 0, 0) == kept);
    CHECK(a.pages_used(0) == (kept + 2) / 3);
    CHECK(a.pages_free() + a.pages_used(0) == 40);
    // survivors are exactly the kept positions, each with its own K/V; survivors below the new
    // length never moved
    std::vector<std::int32_t> want, got;
    for (std::int64_t i = 0; i < n; ++i)
      if (keep[static_cast<std::size_t>(i)]) want.push_back(static_cast<std::int32_t>(i));
    const auto head = a.layout(0, 0, 0);
    for (std::int64_t i = 0; i < kept; ++i) {
      const auto slot = head.slot(i);
      const auto p = a.pool().meta(slot).position;
      got.push_back(p);
      CHECK(a.pool().key(slot)[1] == doctest::Approx(p + 0.01f));
      CHECK(a.pool().value(slot)[0] == doctest::Approx(-static_cast<float>(p)));
      if (keep[static_cast<std::size_t>(i)]) CHECK(p == i);
    }
    std::sort(got.begin(), got.end());
    CHECK(got == want);
  }
}

TEST_CASE("contiguous: one region per head, capacity errors change nothing, regions recycled") {
  const CacheShape shape{1, 2, 2, 2};
  memory::Contiguous<half> a(5, 2);
  a.bind(shape);
  a.add_sequence(10);
  a.add_sequence(11);
  CHECK_THROWS_WITH_AS(a.add_sequence(12), doctest::Contains("all 2 sequence regions are in use"), Error);
  append_tokens(a, 10, 0, 1, 0, 5, 2);
  CHECK_THROWS_WITH_AS(append_tokens(a, 10, 0, 1, 5, 1, 2), doctest::Contains("out of capacity"), Error);
  CHECK(a.length(10, 0, 1) == 5);
  CHECK(to_float(a.pool().key(a.layout(10, 0, 1).slot(4))[0]) == 4.0f);  // stored as fp16
  std::vector<std::uint8_t> keep{0, 1, 0, 1, 1};
  CHECK_THROWS_WITH_AS(a.compact(10, 0, 1, std::span<const std::uint8_t>(keep).first(4)),
                       doctest::Contains("keep has 4 flags, the head holds 5 entries"), Error);
  CHECK(a.compact(10, 0, 1, keep) == 2);
  CHECK(a.length(10, 0, 1) == 3);
  // survivors 1, 3, 4: those above the new length (3, 4) filled the holes at indices 0 and 2
  std::vector<std::int32_t> survivors;
  for (std::int64_t i = 0; i < 3; ++i) survivors.push_back(a.pool().meta(a.layout(10, 0, 1).slot(i)).position);
  CHECK(survivors == std::vector<std::int32_t>{3, 1, 4});
  CHECK(to_float(a.pool().key(a.layout(10, 0, 1).slot(0))[0]) == 3.0f);
  a.remove_sequence(10);
  a.add_sequence(12);
  CHECK(a.length(12, 0, 1) == 0);
  CHECK(a.pages_free() + a.pages_used(11) + a.pages_used(12) == a.pages_total());
}

TEST_CASE("allocator arguments are validated") {
  CHECK_THROWS_WITH_AS(memory::Paged<4>(0), doctest::Contains("pages = 0"), Error);
  CHECK_THROWS_WITH_AS(memory::Paged<4>(std::int64_t{1} << 31), doctest::Contains("pages = 2147483648"), Error);
  CHECK_THROWS_WITH_AS(memory::Contiguous<float>(0, 1), doctest::Contains("capacity = 0"), Error);
  CHECK_THROWS_WITH_AS(memory::Contiguous<float>(4, 0), doctest::Contains("max_sequences = 0"), Error);
  memory::Paged<4> a(8);
  CHECK_THROWS_WITH_AS(a.add_sequence(0), doctest::Contains("add_sequence before bind"), Error);
  CHECK_THROWS_WITH_AS(a.bind(CacheShape{1, 0, 1, 4}), doctest::Contains("kv_heads = 0"), Error);
  a.bind(CacheShape{2, 1, 1, 2});
  a.add_sequence(0);
  CHECK_THROWS_WITH_AS(a.bind(CacheShape{1, 1, 1, 2}), doctest::Contains("already holds 1 sequences"), Error);
  CHECK_THROWS_WITH_AS(a.append(0, 0, 0, -1, nullptr, nullptr, nullptr), doctest::Contains("tokens = -1 must be >= 0"), Error);
  // per-layer accounting: only that layer's heads count
  append_tokens(a, 0, 0, 0, 0, 16, 2);  // 4 pages for layer 0
  CHECK(a.pages_needed(0, 1, 0) == 1);
  CHECK(a.pages_needed(0, 1, 1) == 1);
  CHECK(a.pages_needed(0, 1) == 2);
  CHECK(a.can_append(0, 16, 1));
  CHECK_FALSE(a.can_append(0, 17, 1));
  CHECK_THROWS_WITH_AS(memory::Contiguous<float>(std::int64_t{1} << 60, 2).bind(CacheShape{1, 1, 1, 8}),
                       doctest::Contains("overflows the pool's size"), Error);
}

// AddressSanitizer ends the process on an allocation it cannot serve instead of throwing, so this
// case runs only without it.
#if !defined(__SANITIZE_ADDRESS__)
TEST_CASE("a pool the machine cannot hold is a kvpolicy::Error naming its size, not std::bad_alloc") {
  memory::Paged<16> a(INT32_MAX);  // 2^31 - 1 pages x 16 slots x 1 KiB of K/V: about 35 TB
  CHECK_THROWS_WITH_AS(a.bind(CacheShape{1, 1, 1, 128}), doctest::Contains("34359738352 slots x head_dim 128"), Error);
  memory::Contiguous<float> c(std::int64_t{1} << 40, 1);
  CHECK_THROWS_WITH_AS(c.bind(CacheShape{1, 1, 1, 8}), doctest::Contains("out of host memory"), Error);
}
#endif
