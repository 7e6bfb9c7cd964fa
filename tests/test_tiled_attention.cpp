// cpu/tiled_attention.hpp (SPEC §6, §3's mask, §5's mass) against a brute-force oracle in double, on
// thousands of random heads: fp32/fp16/bf16 storage, d not a multiple of the vector width, G·T rows
// across the few-rows path (<= 8), one row block and several (> 64), tiles cut mid-page, entries out
// of position order (as compaction leaves them), duplicated keys (tied logits), WG-KV's
// vertical-slash mask with gates on tau, sinks, queries that see nothing. The portable attend_paged
// is held to the same oracle, and so is flash-decoding: the head cut into ranges whose states merge.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvpolicy/cpu/attention.hpp"
#include "kvpolicy/cpu/tiled_attention.hpp"
#include "kvpolicy/memory/paged.hpp"

using namespace kvpolicy;

namespace {

struct Head {
  std::int64_t n = 0;
  int G = 1, d = 1;
  std::int64_t T = 1;
  std::vector<float> k, v, q;  // k, v as stored (widened back from the storage dtype)
  std::vector<EntryMeta> meta;
  std::vector<std::int32_t> q_pos;
  AttentionMask mask;
};

// o and mass by the definition: for row (g, t), p_j = softmax over the visible keys of q.k_j/sqrt(d).
void oracle(const Head& h, std::vector<double>& out, std::vector<double>& mass) {
  out.assign(static_cast<std::size_t>(h.G * h.T * h.d), 0.0);
  mass.assign(static_cast<std::size_t>(h.n), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(h.d));
  for (int g = 0; g < h.G; ++g)
    for (std::int64_t t = 0; t < h.T; ++t) {
      const float* q = &h.q[static_cast<std::size_t>((g * h.T + t) * h.d)];
      std::vector<double> s(static_cast<std::size_t>(h.n), -INFINITY);
      double m = -INFINITY;
      for (std::int64_t j = 0; j < h.n; ++j) {
        const EntryMeta& e = h.meta[static_cast<std::size_t>(j)];
        if (!h.mask.visible(e.position, h.mask.gate_of(e), h.q_pos[static_cast<std::size_t>(t)])) continue;
        double dot = 0;
        for (int c = 0; c < h.d; ++c) dot += double(q[c]) * h.k[static_cast<std::size_t>(j * h.d + c)];
        s[static_cast<std::size_t>(j)] = dot * scale;
        m = std::max(m, s[static_cast<std::size_t>(j)]);
      }
      if (m == -INFINITY) continue;
      double l = 0;
      for (double x : s) l += std::exp(x - m);
      double* o = &out[static_cast<std::size_t>((g * h.T + t) * h.d)];
      for (std::int64_t j = 0; j < h.n; ++j) {
        const double p = std::exp(s[static_cast<std::size_t>(j)] - m) / l;
        mass[static_cast<std::size_t>(j)] += p;
        for (int c = 0; c < h.d; ++c) o[c] += p * h.v[static_cast<std::size_t>(j * h.d + c)];
      }
    }
}

template <class Storage, int PageSize>
void check_random_head(std::mt19937_64& rng, int trial) {
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  std::normal_distribution<float> normal;
  Head h;
  const int Gs[] = {1, 2, 3, 4, 8};
  const int ds[] = {1, 4, 8, 12, 33, 64};
  const std::int64_t Ts[] = {1, 1, 1, 2, 3, 7, 9, 22, 65, 70};
  h.G = Gs[pick(rng) % 5];
  h.d = ds[pick(rng) % 6];
  h.T = Ts[pick(rng) % 10];
  if (h.G * h.T > 72) h.T = std::max<std::int64_t>(1, 72 / h.G);  // up to two row blocks
  h.n = pick(rng) % 4 == 0 ? pick(rng) % 4 : pick(rng) % 160;  // some empty and tiny heads
  // positions 0..n-1 in a shuffled storage order (compaction's hole filling), or in order
  std::vector<std::int32_t> pos(static_cast<std::size_t>(h.n));
  std::iota(pos.begin(), pos.end(), 0);
  if (pick(rng) % 2) std::shuffle(pos.begin(), pos.end(), rng);
  const bool ties = pick(rng) % 3 == 0;  // every key one of three: equal logits everywhere
  std::vector<float> k(static_cast<std::size_t>(h.n * h.d)), v(k.size());
  for (auto& x : k) x = normal(rng);
  for (auto& x : v) x = normal(rng);
  if (ties)
    for (std::int64_t j = 3; j < h.n; ++j)
      std::copy_n(&k[static_cast<std::size_t>((j % 3) * h.d)], h.d, &k[static_cast<std::size_t>(j * h.d)]);
  const int mask_kind = pick(rng) % 4;  // 0, 1: causal; 2: WG-KV's own (write_score holds g); 3: a ring (gate)
  if (mask_kind >= 2) {
    const std::int64_t locals[] = {1, 3, 17, 80};
    h.mask.local = locals[pick(rng) % 4];
    h.mask.tau = 0.5f;
    h.mask.gate_field = mask_kind == 3 ? GateField::gate : GateField::write_score;
    h.mask.sinks = pick(rng) % 2 ? 2 : 0;
  }
  for (std::int64_t j = 0; j < h.n; ++j) {
    EntryMeta e{};
    e.position = pos[static_cast<std::size_t>(j)];
    const float g = (pick(rng) % 4) * 0.25f;  // 0.5 = tau: on the boundary, visible
    (mask_kind == 3 ? e.gate : e.write_score) = g;
    h.meta.push_back(e);
  }
  h.q.resize(static_cast<std::size_t>(h.G * h.T * h.d));
  for (auto& x : h.q) x = normal(rng) * 2.0f;
  // decode or a prefill chunk ending at n, or queries earlier than some keys (they see fewer or none)
  const std::int32_t last = static_cast<std::int32_t>(pick(rng) % 5 == 0 ? pick(rng) % (h.n + 1) : h.n);
  for (std::int64_t t = 0; t < h.T; ++t) h.q_pos.push_back(static_cast<std::int32_t>(last - h.T + t));

  memory::Paged<PageSize, Storage> a(std::max<std::int64_t>(1, (h.n + PageSize - 1) / PageSize));
  a.bind(CacheShape{1, 1, h.G, h.d});
  a.add_sequence(0);
  a.append(0, 0, 0, h.n, k.data(), v.data(), h.meta.data());
  h.k.resize(k.size());
  h.v.resize(v.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    h.k[i] = to_float(from_float<Storage>(k[i]));
    h.v[i] = to_float(from_float<Storage>(v[i]));
  }
  std::vector<double> want_out, want_mass;
  oracle(h, want_out, want_mass);
  double vmax = 1e-30;
  for (float x : h.v) vmax = std::max(vmax, double(std::abs(x)));

  for (int kernel = 0; kernel < 2; ++kernel) {
    CAPTURE(trial);
    CAPTURE(kernel);
    CAPTURE(h.n);
    CAPTURE(h.G);
    CAPTURE(h.T);
    CAPTURE(h.d);
    CAPTURE(mask_kind);
    std::vector<float> out(h.q.size(), std::nanf("")), mass(static_cast<std::size_t>(h.n), 0.0f);
    const View<const float, 3> q(h.q.data(), {h.G, h.T, h.d});
    const View<float, 3> o(out.data(), {h.G, h.T, h.d});
    if (kernel == 0)
      cpu::attend_tiled(a.pool(), a.layout(0, 0, 0), 0, h.G, q, h.q_pos, o, std::span<float>(mass), h.mask);
    else
      cpu::attend_paged(a.pool(), a.layout(0, 0, 0), 0, h.G, q, h.q_pos, o, std::span<float>(mass), h.mask);
    double worst_out = 0, worst_mass = 0;
    int bad = 0;  // counted, then checked once: a doctest assertion per element would dominate the run
    for (std::size_t i = 0; i < out.size(); ++i) {
      bad += !std::isfinite(out[i]);  // every element written (the buffer starts as NaN)
      worst_out = std::max(worst_out, std::abs(out[i] - want_out[i]));
    }
    for (std::size_t j = 0; j < mass.size(); ++j) {
      worst_mass = std::max(worst_mass, std::abs(mass[j] - want_mass[j]));
      bad += want_mass[j] == 0.0 && mass[j] != 0.0f;  // an invisible key gets no mass at all
    }
    CHECK(bad == 0);
    CHECK(worst_out <= 4e-6 * vmax);
    CHECK(worst_mass <= 4e-6 * static_cast<double>(h.G * h.T));
  }

  // Flash-decoding: the head cut at random points into ranges (empty ones too), each range's state,
  // merged in order, against the same oracle; one range is attend_tiled's answer bit for bit.
  const std::int64_t rows = std::int64_t{h.G} * h.T;
  if (rows > cpu::kPartialMaxRows) return;
  std::vector<std::int64_t> cuts{0, h.n};
  for (int c = pick(rng) % 5; c > 0; --c) cuts.push_back(h.n == 0 ? 0 : pick(rng) % (h.n + 1));
  std::sort(cuts.begin(), cuts.end());
  const auto ranges = cuts.size() - 1;
  std::vector<float> m(ranges * static_cast<std::size_t>(rows), std::nanf("")), l(m.size(), std::nanf("")),
      acc(m.size() * static_cast<std::size_t>(h.d), std::nanf(""));
  std::vector<cpu::SoftmaxPartial> parts;
  const View<const float, 3> q(h.q.data(), {h.G, h.T, h.d});
  for (std::size_t i = 0; i < ranges; ++i) {
    const std::size_t at = i * static_cast<std::size_t>(rows);
    parts.push_back({m.data() + at, l.data() + at, acc.data() + at * static_cast<std::size_t>(h.d)});
    cpu::attend_tiled_partial(a.pool(), a.layout(0, 0, 0), 0, h.G, q, h.q_pos, cuts[i], cuts[i + 1], parts.back(), h.mask);
  }
  std::vector<float> split(h.q.size(), std::nanf("")), whole(h.q.size(), std::nanf("")), one(h.q.size(), std::nanf(""));
  cpu::merge_softmax_partials(parts, rows, h.d, split.data());
  cpu::attend_tiled(a.pool(), a.layout(0, 0, 0), 0, h.G, q, h.q_pos, View<float, 3>(whole.data(), {h.G, h.T, h.d}), {},
                    h.mask);
  cpu::attend_tiled_partial(a.pool(), a.layout(0, 0, 0), 0, h.G, q, h.q_pos, 0, h.n, parts[0], h.mask);
  cpu::merge_softmax_partials(std::span(parts.data(), 1), rows, h.d, one.data());
  double worst = 0;
  int bad = 0;
  for (std::size_t i = 0; i < split.size(); ++i) {
    bad += !std::isfinite(split[i]);
    worst = std::max(worst, std::abs(split[i] - want_out[i]));
  }
  CAPTURE(trial);
  CAPTURE(ranges);
  CHECK(bad == 0);
  CHECK(worst <= 4e-6 * vmax);
  CHECK(std::memcmp(one.data(), whole.data(), one.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("tiled attention and its ranges merged match the brute-force oracle: 3000 random heads, fp32, fp16, bf16, masks, ties") {
  std::mt19937_64 rng(20261123);
  for (int trial = 0; trial < 1000; ++trial) {
    check_random_head<float, 16>(rng, trial);
    check_random_head<half, 5>(rng, trial);
    check_random_head<bfloat16, 1>(rng, trial);
  }
}

TEST_CASE("tiled attention: a query that sees no key gets zeros, and the rows outside the group stay untouched") {
  const float k[4] = {1, 0, 0, 1}, v[4] = {2, 4, 6, 8};
  memory::Paged<16> a(1);
  a.bind(CacheShape{1, 2, 4, 2});
  a.add_sequence(0);
  const EntryMeta m[2] = {{3, 0.0f, 0.0f}, {4, 0.0f, 0.0f}};
  a.append(0, 0, 1, 2, k, v, m);
  // Hq = 4, G = 2: kv head 1 owns query heads 2 and 3; heads 0 and 1 must keep their poison
  std::vector<float> q(4 * 1 * 2, 1.0f), out(q.size(), -7.0f);
  const std::int32_t q_pos[1] = {2};  // before both keys
  cpu::attend_tiled(a.pool(), a.layout(0, 0, 1), 1, 2, View<const float, 3>(q.data(), {4, 1, 2}), std::span(q_pos, 1),
                    View<float, 3>(out.data(), {4, 1, 2}));
  for (int i = 0; i < 4; ++i) CHECK(out[static_cast<std::size_t>(i)] == -7.0f);
  for (int i = 4; i < 8; ++i) CHECK(out[static_cast<std::size_t>(i)] == 0.0f);
  // at position 3 the first key alone is visible: its value, exactly
  const std::int32_t at3[1] = {3};
  cpu::attend_tiled(a.pool(), a.layout(0, 0, 1), 1, 2, View<const float, 3>(q.data(), {4, 1, 2}), std::span(at3, 1),
                    View<float, 3>(out.data(), {4, 1, 2}));
  CHECK(out[4] == 2.0f);
  CHECK(out[5] == 4.0f);
}

TEST_CASE("widen: F16C (where compiled in) and the portable conversions agree on every fp16 and bf16 value") {
  std::vector<half> h(65536);
  std::vector<bfloat16> b(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    h[i].bits = static_cast<std::uint16_t>(i);
    b[i].bits = static_cast<std::uint16_t>(i);
  }
  std::vector<float> wh(65536), wb(65536);
  cpu::widen(h.data(), wh.data(), 65536);
  cpu::widen(b.data(), wb.data(), 65536);
  int mismatches = 0;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const float ph = to_float(h[i]), pb = to_float(b[i]);
    if (std::memcmp(&ph, &wh[i], 4) != 0 && !(std::isnan(ph) && std::isnan(wh[i]))) ++mismatches;
    if (std::memcmp(&pb, &wb[i], 4) != 0) ++mismatches;
  }
  CHECK(mismatches == 0);
  const std::string route = std::string("widen: Eigen's 8-lane packets ") + (KVPOLICY_WIDEN_PACKET8 ? "on" : "off");
  MESSAGE(route);
}
