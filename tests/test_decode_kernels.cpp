// cpu/decode_kernels.hpp (the decode step's logits and P·V, SPEC §6) against a brute-force oracle in
// double on thousands of random cases: fp32/fp16/bf16 storage, every row count 1..8, head dims that
// are and are not multiples of 8 (the packet kernels and the portable fallback), entry counts that
// leave partial blocks, entries anywhere in memory and repeated (tied logits), and the packet kernels
// held to the portable ones where compiled in. Asking for entries ahead (DecodeAhead) changes no bit.
// The pool's rows start on cache lines (memory/pool.hpp), so a row's vector loads never straddle two.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvpolicy/cpu/decode_kernels.hpp"
#include "kvpolicy/memory/pool.hpp"

using namespace kvpolicy;

namespace {

struct Case {
  std::int64_t rows = 1, d = 8, n = 0;
  std::vector<float> q, p;             // [rows, d] and [rows, ld]
  std::int64_t ld = 0;
  std::vector<std::int64_t> order;     // entry j is row order[j] of the store (repeats allowed)
};

template <class Storage>
struct Store {
  std::vector<Storage> k, v;  // [rows_stored, d]
  std::vector<const Storage*> kp, vp;
};

template <class Storage>
Case make_case(std::mt19937& rng, Store<Storage>& store) {
  Case c;
  std::uniform_int_distribution<int> rows(1, static_cast<int>(cpu::kDecodeMaxRows));
  const std::int64_t dims[] = {8, 16, 24, 64, 128, 5, 12, 1, 130};
  c.rows = rows(rng);
  c.d = dims[std::uniform_int_distribution<int>(0, 8)(rng)];
  c.n = std::uniform_int_distribution<std::int64_t>(0, 70)(rng);
  c.ld = c.n + std::uniform_int_distribution<std::int64_t>(0, 3)(rng);
  const std::int64_t stored = std::max<std::int64_t>(1, c.n / 2 + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const bool ties = std::uniform_int_distribution<int>(0, 3)(rng) == 0;  // few distinct values
  const auto value = [&] { return ties ? std::round(normal(rng) * 2.0f) / 2.0f : normal(rng); };
  store.k.resize(static_cast<std::size_t>(stored * c.d));
  store.v.resize(store.k.size());
  for (auto& x : store.k) x = from_float<Storage>(value());
  for (auto& x : store.v) x = from_float<Storage>(value());
  c.q.resize(static_cast<std::size_t>(c.rows * c.d));
  for (auto& x : c.q) x = value();
  c.p.resize(static_cast<std::size_t>(c.rows * std::max<std::int64_t>(c.ld, 1)));
  for (auto& x : c.p) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
  std::uniform_int_distribution<std::int64_t> pick(0, stored - 1);
  store.kp.clear();
  store.vp.clear();
  for (std::int64_t j = 0; j < c.n; ++j) {
    const std::int64_t row = pick(rng);
    c.order.push_back(row);
    store.kp.push_back(store.k.data() + row * c.d);
    store.vp.push_back(store.v.data() + row * c.d);
  }
  return c;
}

// |got - exact| within fp32 rounding of a sum of `terms` products of magnitude up to `scale`.
void check_close(float got, double exact, double magnitude, std::int64_t terms) {
  const double tol = 4.0 * static_cast<double>(terms + 1) * 6e-8 * magnitude + 1e-30;
  REQUIRE(std::isfinite(got));
  REQUIRE(std::abs(got - exact) <= tol);
}

template <class Storage>
void check_logits(const Case& c, const Store<Storage>& store, const std::vector<float>& s) {
  for (std::int64_t r = 0; r < c.rows; ++r)
    for (std::int64_t j = 0; j < c.n; ++j) {
      double exact = 0, magnitude = 0;
      for (std::int64_t i = 0; i < c.d; ++i) {
        const double term = double(c.q[static_cast<std::size_t>(r * c.d + i)]) * to_float(store.kp[static_cast<std::size_t>(j)][i]);
        exact += term;
        magnitude += std::abs(term);
      }
      check_close(s[static_cast<std::size_t>(r * c.ld + j)], exact, magnitude, c.d);
    }
}

template <class Storage>
void check_accumulate(const Case& c, const Store<Storage>& store, const std::vector<float>& acc0, const std::vector<float>& acc) {
  for (std::int64_t r = 0; r < c.rows; ++r)
    for (std::int64_t i = 0; i < c.d; ++i) {
      double exact = acc0[static_cast<std::size_t>(r * c.d + i)], magnitude = std::abs(exact);
      for (std::int64_t j = 0; j < c.n; ++j) {
        const double term = double(c.p[static_cast<std::size_t>(r * c.ld + j)]) * to_float(store.vp[static_cast<std::size_t>(j)][i]);
        exact += term;
        magnitude += std::abs(term);
      }
      check_close(acc[static_cast<std::size_t>(r * c.d + i)], exact, magnitude, c.n);
    }
}

template <class Storage>
void run_cases(std::uint32_t seed, int cases) {
  std::mt19937 rng(seed);
  Store<Storage> store;
  for (int trial = 0; trial < cases; ++trial) {
    const Case c = make_case(rng, store);
    CAPTURE(trial);
    CAPTURE(c.rows);
    CAPTURE(c.d);
    CAPTURE(c.n);
    const std::span<const Storage* const> keys(store.kp), values(store.vp);
    const std::size_t s_size = static_cast<std::size_t>(c.rows * std::max<std::int64_t>(c.ld, 1));

    std::vector<float> s(s_size, NAN), s_portable(s_size, NAN), s_ahead(s_size, NAN);
    cpu::decode_logits(c.q.data(), c.rows, c.d, keys, s.data(), c.ld);
    check_logits(c, store, s);
    cpu::decode_logits_portable(c.q.data(), c.rows, c.d, keys, s_portable.data(), c.ld);
    check_logits(c, store, s_portable);
    // Asking for entries ahead (here: the same ones, reversed) is only a hint: the same bits.
    const std::vector<const Storage*> rk(store.kp.rbegin(), store.kp.rend()), rv(store.vp.rbegin(), store.vp.rend());
    cpu::decode_logits(c.q.data(), c.rows, c.d, keys, s_ahead.data(), c.ld, cpu::DecodeAhead<Storage>{rk, rv});
    for (std::int64_t r = 0; r < c.rows; ++r)
      for (std::int64_t j = 0; j < c.n; ++j)
        REQUIRE(std::memcmp(&s[static_cast<std::size_t>(r * c.ld + j)], &s_ahead[static_cast<std::size_t>(r * c.ld + j)], sizeof(float)) == 0);

    std::vector<float> acc0(static_cast<std::size_t>(c.rows * c.d));
    for (auto& x : acc0) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
    std::vector<float> acc = acc0, acc_portable = acc0;
    cpu::decode_accumulate(c.p.data(), c.ld, c.rows, c.d, values, acc.data());
    check_accumulate(c, store, acc0, acc);
    cpu::decode_accumulate_portable(c.p.data(), c.ld, c.rows, c.d, values, acc_portable.data());
    check_accumulate(c, store, acc0, acc_portable);
#if KVPOLICY_DECODE_PACKET8
    if (c.d % 8 == 0) {  // the dispatch took the packet kernels: the same as calling them
      std::vector<float> s_packet(s_size, NAN), acc_packet = acc0;
      cpu::decode_logits_packet8(c.q.data(), c.rows, c.d, keys, s_packet.data(), c.ld);
      cpu::decode_accumulate_packet8(c.p.data(), c.ld, c.rows, c.d, values, acc_packet.data());
      for (std::int64_t r = 0; r < c.rows; ++r)
        for (std::int64_t j = 0; j < c.n; ++j)
          REQUIRE(std::memcmp(&s[static_cast<std::size_t>(r * c.ld + j)], &s_packet[static_cast<std::size_t>(r * c.ld + j)], sizeof(float)) == 0);
      REQUIRE(std::memcmp(acc.data(), acc_packet.data(), acc.size() * sizeof(float)) == 0);
    }
#endif
  }
}

}  // namespace

TEST_CASE("decode kernels: logits and P.V match a double oracle (fp32 storage)") { run_cases<float>(11, 1500); }
TEST_CASE("decode kernels: logits and P.V match a double oracle (fp16 storage)") { run_cases<half>(12, 1500); }
TEST_CASE("decode kernels: logits and P.V match a double oracle (bf16 storage)") { run_cases<bfloat16>(13, 1500); }

#ifdef KVPOLICY_EXPECT_DECODE_PACKET8
// The builds of this file for other x86-64 targets (tests/CMakeLists.txt) say which kernels they meant
// to test: the packet kernels under -mavx alone, the portable ones without AVX.
TEST_CASE("decode kernels: this build runs the kernels it was built to test") {
  CHECK(KVPOLICY_DECODE_PACKET8 == KVPOLICY_EXPECT_DECODE_PACKET8);
}
#endif

TEST_CASE("decode kernels: the pool's K and V rows start on 64-byte cache lines") {
  memory::EntryPool<half> pool;
  pool.resize(37, 64);
  for (std::int64_t slot = 0; slot < 37; ++slot) {
    REQUIRE(reinterpret_cast<std::uintptr_t>(pool.key(slot)) % 64 == 0);
    REQUIRE(reinterpret_cast<std::uintptr_t>(pool.value(slot)) % 64 == 0);
  }
  memory::EntryPool<float> rows_of_96_bytes;  // a row of 24 floats: only the pool's start is aligned
  rows_of_96_bytes.resize(5, 24);
  REQUIRE(reinterpret_cast<std::uintptr_t>(rows_of_96_bytes.key(0)) % 64 == 0);
  REQUIRE(reinterpret_cast<std::uintptr_t>(rows_of_96_bytes.value(0)) % 64 == 0);
}
