// Paged ragged decode attention against the dense reference (SPEC §6): every head dim (64, 128,
// 256), storage dtype (fp32, fp16, bf16) and page size (16, 32, 64), GQA groups from 1 to 12
// (more than one block per group), ragged heads from 0 entries to more than 64K (split along the
// cache and merged), partly filled pages in a shuffled pool. ‖out − ref‖ / ‖ref‖ within 1e-5
// (fp32), 2e-3 (fp16), 1e-2 (bf16); the output is poisoned (NaN) before each run and must come
// back fully written. With accumulate_mass (H2O, SPEC §5) every entry's attention mass must grow by
// the probability the reference gives it, summed over its group's query heads (within 1e-5 of
// 1 + mass), and every pool slot no head holds must keep its mass bit for bit.
// Each case runs on both kernels where the tensor-core one applies (fp16/bf16, head_dim 64/128, no
// mass, a device of compute capability 8.0 or more: docs/perf.md, "Decode kernels"), each within
// the same tolerance.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "device_buffer.hpp"
#include "kvpolicy/cuda/kernels/attention.cuh"
#include "test_scale.hpp"

namespace kp = kvpolicy;
namespace kc = kvpolicy::gpu;
using cudatest::DeviceBuffer;

namespace {

template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  else if constexpr (std::is_same_v<T, __half>) return 2e-3;
  else return 1e-2;
}

/// softmax(q k^T / sqrt(d)) v over the visible ones of n entries, in double (the reference's own
/// error stays far below the fp32 tolerance even at 64K entries); zeros when none is visible. The
/// probabilities are added to `mass`.
void reference_attention(const float* q, const std::vector<float>& k, const std::vector<float>& v,
                         const std::vector<std::uint8_t>& visible, std::int64_t n, int d, float* out,
                         std::vector<double>& mass) {
  std::vector<double> logit(static_cast<std::size_t>(n), -std::numeric_limits<double>::infinity());
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t i = 0; i < n; ++i) {
    if (!visible[i]) continue;
    double s = 0.0;
    for (int c = 0; c < d; ++c) s += double(q[c]) * k[i * d + c];
    logit[i] = s / std::sqrt(double(d));
    m = std::max(m, logit[i]);
  }
  std::vector<double> acc(d, 0.0);
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (!visible[i]) continue;
    const double w = std::exp(logit[i] - m);
    sum += w;
    for (int c = 0; c < d; ++c) acc[c] += w * v[i * d + c];
  }
  for (int c = 0; c < d; ++c) out[c] = sum == 0.0 ? 0.0f : static_cast<float>(acc[c] / sum);
  if (sum > 0.0)
    for (std::int64_t i = 0; i < n; ++i)
      if (visible[i]) mass[i] += std::exp(logit[i] - m) / sum;
}

/// Whether the tensor-core decode kernel can run on this device (compute capability 8.0 or more).
bool tensor_cores_here() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major >= 8;
}

/// The kernels a case of this dtype and shape runs on.
template <class T>
std::vector<kc::DecodeKernel> kernels_for(int head_dim, bool with_mass) {
  std::vector<kc::DecodeKernel> k{kc::DecodeKernel::cuda_cores};
  if (!std::is_same_v<T, float> && head_dim <= 128 && !with_mass && tensor_cores_here())
    k.push_back(kc::DecodeKernel::tensor_cores);
  return k;
}

struct AttnCase {
  int batch, kv_heads, group, head_dim, page_size;
  std::vector<std::int64_t> lengths;  // [batch * kv_heads]
  kp::AttentionMask mask{};           // WG-KV's vertical-slash mask when mask.local > 0
  int ungated_segment = -1;           // with the mask: this segment's keys all have g < tau
  float query_scale = 1.0f;           // queries ~ N(0, query_scale^2)
};

/// Builds the case's pool on both sides and compares; returns the relative error of the output (the
/// attention mass, with with_mass, is checked here).
template <class T>
double run_case(const AttnCase& c, std::uint64_t seed, bool with_mass = false,
                kc::DecodeKernel kernel = kc::DecodeKernel::cuda_cores, std::int32_t splits = 0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const int d = c.head_dim, P = c.page_size, segments = c.batch * c.kv_heads;
  const int q_heads = c.kv_heads * c.group;
  std::int64_t pages = 0, max_pages = 1, longest = 0;
  for (auto n : c.lengths) {
    pages += (n + P - 1) / P;
    max_pages = std::max<std::int64_t>(max_pages, (n + P - 1) / P);
    longest = std::max(longest, n);
  }
  pages += 3;  // pages no head uses
  std::vector<std::int32_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<T> keys(std::size_t(pages) * P * d), values(keys.size());
  std::vector<float> kf(keys.size()), vf(keys.size());  // the stored values, widened
  for (std::size_t i = 0; i < keys.size(); ++i) {
    keys[i] = kc::detail::from_float<T>(normal(rng) * 1.5f);
    values[i] = kc::detail::from_float<T>(normal(rng));
    kf[i] = kc::detail::to_float(keys[i]);
    vf[i] = kc::detail::to_float(values[i]);
  }
  std::vector<std::int32_t> table(std::size_t(segments) * max_pages, 0), length(segments), base(c.batch);
  std::int64_t next = 0;
  for (int s = 0; s < segments; ++s) {
    length[s] = static_cast<std::int32_t>(c.lengths[s]);
    for (std::int64_t p = 0; p < (c.lengths[s] + P - 1) / P; ++p) table[std::size_t(s) * max_pages + p] = order[next++];
  }
  for (int b = 0; b < c.batch; ++b) base[b] = b * c.kv_heads;
  std::vector<float> q(std::size_t(c.batch) * q_heads * d);
  for (auto& x : q) x = normal(rng) * c.query_scale;
  std::vector<float> mass0(std::size_t(pages) * P);  // the mass before the step: accumulated onto
  for (auto& x : mass0) x = std::uniform_real_distribution<float>(0.0f, 4.0f)(rng);
  std::vector<double> mass_ref(mass0.begin(), mass0.end());
  // entry i of a head sits at position i, with a write gate g on either side of tau; the query of
  // batch row b at the position after its longest head (every key is causally visible)
  const bool masked = c.mask.local > 0;
  std::vector<std::int32_t> pos_host(std::size_t(pages) * P, 0), q_pos(c.batch, 0);
  std::vector<float> gate_host(pos_host.size(), 1.0f);
  for (int s = 0; s < segments; ++s)
    for (std::int64_t i = 0; i < c.lengths[s]; ++i) {
      const std::int64_t slot = std::int64_t{table[std::size_t(s) * max_pages + i / P]} * P + i % P;
      pos_host[slot] = static_cast<std::int32_t>(i);
      gate_host[slot] = s == c.ungated_segment || std::uniform_int_distribution<int>(0, 1)(rng) ? 0.5f * c.mask.tau
                                                                                               : 2.0f * c.mask.tau;
      q_pos[s / c.kv_heads] = std::max(q_pos[s / c.kv_heads], static_cast<std::int32_t>(c.lengths[s]));
    }

  // reference: dense attention over each head's entries in order, in double
  std::vector<float> ref(q.size());
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.kv_heads; ++h) {
      const int s = b * c.kv_heads + h;
      const std::int64_t n = c.lengths[s];
      std::vector<float> k(std::size_t(n) * d), v(k.size());
      std::vector<std::uint8_t> visible(std::size_t(n), 1);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t slot = std::int64_t{table[std::size_t(s) * max_pages + i / P]} * P + i % P;
        std::copy_n(&kf[slot * d], d, &k[i * d]);
        std::copy_n(&vf[slot * d], d, &v[i * d]);
        if (masked) visible[i] = c.mask.visible(pos_host[slot], gate_host[slot], q_pos[b]);
      }
      std::vector<double> head_mass(std::size_t(n), 0.0);
      for (int g = 0; g < c.group; ++g) {
        const float* qh = &q[(std::size_t(b) * q_heads + h * c.group + g) * d];
        float* oh = &ref[(std::size_t(b) * q_heads + h * c.group + g) * d];
        reference_attention(qh, k, v, visible, n, d, oh, head_mass);
      }
      for (std::int64_t i = 0; i < n; ++i)
        mass_ref[std::int64_t{table[std::size_t(s) * max_pages + i / P]} * P + i % P] += head_mass[i];
    }

  DeviceBuffer<T> dk(keys), dv(values);
  DeviceBuffer<std::int32_t> dpos(pos_host), dtable(table), dlen(length), dbase(base), dq_pos(q_pos);
  DeviceBuffer<float> dmeta(gate_host), dq(q), dout(q.size()), dmass(mass0);
  dout.poison(0xFF);  // NaN everywhere
  kc::PagedKV<T> kv{dk.get(), dv.get(), dpos.get(), dmeta.get(), static_cast<std::int32_t>(pages), P, d};
  kv.fields[kp::Field::attention_mass] = with_mass ? dmass.get() : nullptr;
  kc::BlockTableView t{dtable.get(), dlen.get(), segments, static_cast<std::int32_t>(max_pages)};
  kc::DecodeBatch a{dq.get(), dbase.get(), c.batch, q_heads, c.kv_heads, dout.get()};
  a.accumulate_mass = with_mass;
  a.kernel = kernel;
  a.splits = splits;
  a.mask = c.mask;  // g is the write score (WG-KV's own cache)
  a.query_position = masked ? dq_pos.get() : nullptr;
  std::size_t bytes = 0;
  kc::decode_attention(nullptr, bytes, kv, t, a, longest, nullptr);
  DeviceBuffer<unsigned char> ws(bytes);
  kc::decode_attention(ws.get(), bytes, kv, t, a, longest, nullptr);
  cudatest::sync();
  const auto out = dout.download();
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    REQUIRE_MESSAGE(std::isfinite(out[i]), "output ", i, " not written (or not finite), seed ", seed);
    num += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  const auto mass = dmass.download();
  std::vector<std::uint8_t> held(mass.size(), 0);
  for (int s = 0; s < segments; ++s)
    for (std::int64_t i = 0; i < c.lengths[s]; ++i) held[std::int64_t{table[std::size_t(s) * max_pages + i / P]} * P + i % P] = 1;
  for (std::size_t slot = 0; slot < mass.size(); ++slot) {
    if (!with_mass || !held[slot]) {  // untouched, bit for bit
      REQUIRE_MESSAGE(std::memcmp(&mass[slot], &mass0[slot], sizeof(float)) == 0, "mass of slot ", slot,
                      " changed (with_mass ", with_mass, "), seed ", seed);
      continue;
    }
    // the increment within 1e-5 of itself, on top of the fp32 rounding of the sum it lands in
    const double got = double(mass[slot]) - mass0[slot], want = mass_ref[slot] - mass0[slot];
    REQUIRE_MESSAGE(std::abs(got - want) <= 1e-5 * want + 4 * FLT_EPSILON * mass_ref[slot], "mass of slot ", slot, ": +",
                    got, " vs +", want, " (from ", mass0[slot], "), seed ", seed);
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

template <class T>
void sweep(std::uint64_t seed0) {
  std::uint64_t seed = seed0;
  for (int d : {64, 128, 256})
    for (int page : {16, 32, 64}) {
      std::mt19937_64 rng(++seed);
      AttnCase c;
      c.batch = std::uniform_int_distribution<int>(1, 4)(rng);
      c.kv_heads = std::uniform_int_distribution<int>(1, 3)(rng);
      const int groups[] = {1, 2, 4, 8, 12};
      c.group = groups[std::uniform_int_distribution<int>(0, 4)(rng)];
      c.head_dim = d;
      c.page_size = page;
      for (int s = 0; s < c.batch * c.kv_heads; ++s) {
        const int mode = std::uniform_int_distribution<int>(0, 9)(rng);
        c.lengths.push_back(mode == 0 ? 0 : mode == 1 ? 1 : mode < 6 ? std::uniform_int_distribution<int>(2, 300)(rng)
                                                                     : std::uniform_int_distribution<int>(301, int(cudatest::length(6000, 301)))(rng));
      }
      const bool with_mass = seed % 2 == 1;  // H2O's mass on half the cases
      INFO("dtype ", kc::dtype_name<T>, ", head_dim ", d, ", page ", page, ", group ", c.group, ", seed ", seed,
           ", mass ", with_mass);
      for (const auto kernel : kernels_for<T>(d, with_mass)) {
        INFO("kernel ", kernel == kc::DecodeKernel::tensor_cores ? "tensor_cores" : "cuda_cores");
        const double err = run_case<T>(c, seed, with_mass, kernel);
        CHECK(err <= tolerance<T>());
      }
    }
}

}  // namespace

TEST_CASE("decode attention, fp32 storage, against the dense reference") { sweep<float>(100); }
TEST_CASE("decode attention, fp16 storage, against the dense reference") { sweep<__half>(200); }
TEST_CASE("decode attention, bf16 storage, against the dense reference") { sweep<__nv_bfloat16>(300); }

TEST_CASE("decode attention under WG-KV's vertical-slash mask, with H2O's mass") {
  // the W_local newest positions before each row's query, and older keys with g >= tau, are
  // visible; segment 1's keys all have g < tau and lie beyond its row's window: it sees none
  AttnCase c{2, 2, 4, 128, 16, {700, 40, 300, 333}, kp::AttentionMask{64, 0.1f}, 1};
  CHECK(run_case<float>(c, 7, true) <= 1e-5);
  for (const auto kernel : kernels_for<__half>(c.head_dim, false)) CHECK(run_case<__half>(c, 8, false, kernel) <= 2e-3);
  for (const auto kernel : kernels_for<__nv_bfloat16>(c.head_dim, false))
    CHECK(run_case<__nv_bfloat16>(c, 10, false, kernel) <= 1e-2);
  AttnCase wide{3, 1, 1, 64, 32, {5000, 17, 64}, kp::AttentionMask{128, 0.3f}, -1};
  CHECK(run_case<float>(wide, 9, true) <= 1e-5);
  for (const auto kernel : kernels_for<__half>(wide.head_dim, false)) CHECK(run_case<__half>(wide, 11, false, kernel) <= 2e-3);
}

TEST_CASE("decode attention with queries far outside fp16's range and far below it") {
  // the tensor-core kernel scales each query row by a power of two into fp16's range and its
  // logits back: 1e6-sized queries (a softmax on one entry) and 1e-7-sized ones (a uniform one)
  for (const float scale : {1e6f, 3e4f, 1e-7f}) {
    AttnCase c{2, 2, 5, 128, 32, {900, 33, 2000, 1}};
    c.query_scale = scale;
    INFO("query scale ", scale);
    for (const auto kernel : kernels_for<__half>(c.head_dim, false)) CHECK(run_case<__half>(c, 12, false, kernel) <= 2e-3);
    for (const auto kernel : kernels_for<__nv_bfloat16>(c.head_dim, false))
      CHECK(run_case<__nv_bfloat16>(c, 13, false, kernel) <= 1e-2);
  }
}

TEST_CASE("decode attention over more than 64K entries per head, split and merged") {
  const int big = int(cudatest::length(70001)), past_64k = int(cudatest::length(65536)) + 17;  // scaled under a simulator
  AttnCase c{2, 2, 4, 128, 16, {big, 1, past_64k, 0}};
  CHECK(run_case<float>(c, 1) <= 1e-5);
  for (const auto kernel : kernels_for<__half>(c.head_dim, false)) CHECK(run_case<__half>(c, 2, false, kernel) <= 2e-3);
  CHECK(run_case<float>(c, 3, true) <= 1e-5);  // with H2O's mass
}

TEST_CASE("decode attention with the split named by the caller: one chunk writes the answer, more are merged") {
  // one chunk (the block's partial is the answer), a few, and one a page (the most a head of 1,200
  // entries takes); heads of 0, 1 and 1,200 entries, with and without H2O's mass, on both kernels
  AttnCase c{3, 2, 4, 128, 16, {1200, 0, 1, int(cudatest::length(1200, 33)), 500, 17}};
  for (const std::int32_t splits : {1, 3, 75, 1024}) {
    INFO("splits ", splits);
    CHECK(run_case<float>(c, 20 + splits, true, kc::DecodeKernel::cuda_cores, splits) <= 1e-5);
    for (const auto kernel : kernels_for<__half>(c.head_dim, false))
      CHECK(run_case<__half>(c, 40 + splits, false, kernel, splits) <= 2e-3);
  }
}

TEST_CASE("decode attention arguments are checked before any launch" * doctest::test_suite("host")) {
  float dummy = 0.0f;
  std::int32_t idummy = 0;
  kc::PagedKV<float> kv{&dummy, &dummy, &idummy, &dummy, 4, 16, 96};
  kc::BlockTableView t{&idummy, &idummy, 2, 4};
  kc::DecodeBatch a{&dummy, &idummy, 1, 8, 2, &dummy};
  std::size_t bytes = 0;
  CHECK_THROWS_WITH(kc::decode_attention(nullptr, bytes, kv, t, a, 100, nullptr, 132),
                    doctest::Contains("head_dim = 96 has no kernel (64, 128 or 256)"));
  kv.head_dim = 128;
  kv.page_size = 8;
  CHECK_THROWS_WITH(kc::decode_attention(nullptr, bytes, kv, t, a, 100, nullptr, 132),
                    doctest::Contains("page_size = 8 has no kernel (16, 32 or 64)"));
  kv.page_size = 16;
  a.q_heads = 7;
  CHECK_THROWS_WITH(kc::decode_attention(nullptr, bytes, kv, t, a, 100, nullptr, 132),
                    doctest::Contains("q_heads = 7 must be a positive multiple of kv_heads = 2"));
  a.q_heads = 8;
  kc::decode_attention(nullptr, bytes, kv, t, a, 100000, nullptr, 132);  // a size query needs no device
  CHECK(bytes > 0);
  kc::DecodeBatch empty = a;
  empty.batch = 0;  // nothing to attend: sized and run without a device
  CHECK(kc::decode_attention_workspace_bytes(empty, 100, 16, 132) > 0);
  kc::decode_attention(nullptr, bytes, kv, t, empty, 100, nullptr, 132);
  kc::decode_attention(reinterpret_cast<void*>(256), bytes, kv, t, empty, 100, nullptr, 132);
  kc::DecodeBatch no_heads = a;
  no_heads.kv_heads = 0;
  CHECK_THROWS_WITH(kc::decode_attention_workspace_bytes(no_heads, 100, 16, 132),
                    doctest::Contains("must be a positive multiple of kv_heads = 0"));
  // H2O's mass needs the pool's mass array, and the group's queries in shared memory
  kc::DecodeBatch h2o = a;
  h2o.accumulate_mass = true;
  CHECK_THROWS_WITH(kc::decode_attention(nullptr, bytes, kv, t, h2o, 100, nullptr, 132),
                    doctest::Contains("accumulate_mass needs the pool's attention_mass array"));
  kv.fields[kp::Field::attention_mass] = &dummy;
  kc::decode_attention(nullptr, bytes, kv, t, h2o, 100, nullptr, 132);
  kc::DecodeBatch wide = h2o;
  wide.q_heads = 2 * 64;  // a group of 64 at head_dim 256: 64 KiB of queries
  kv.head_dim = 256;
  CHECK_THROWS_WITH(kc::decode_attention(nullptr, bytes, kv, t, wide, 100, nullptr, 132),
                    doctest::Contains("accumulate_mass with a group of 64 query heads at head_dim = 256 needs"));
  kv.head_dim = 128;
  kv.fields[kp::Field::attention_mass] = nullptr;
  // the tensor-core kernel, named where it does not apply, is refused with the reason
  kc::DecodeBatch tc = a;
  tc.kernel = kc::DecodeKernel::tensor_cores;
  alignas(16) float rows[4] = {};
  kv.keys = kv.values = rows;
  CHECK_THROWS_WITH(kc::decode_attention(reinterpret_cast<void*>(256), bytes, kv, t, tc, 100, nullptr, 132),
                    doctest::Contains("kernel = tensor_cores does not apply: fp32 storage has no 16-bit tensor-core product"));
  // a named split: within [0, 1024], at most one chunk a page, the same for both kernels
  kc::DecodeBatch named = a;
  named.splits = 1025;
  CHECK_THROWS_WITH(kc::decode_attention(nullptr, bytes, kv, t, named, 100, nullptr, 132),
                    doctest::Contains("splits = 1025 must be in [0, 1024] (0: the plan's)"));
  named.splits = -1;
  CHECK_THROWS_WITH(kc::decode_attention(nullptr, bytes, kv, t, named, 100, nullptr, 132),
                    doctest::Contains("splits = -1 must be in [0, 1024] (0: the plan's)"));
  for (const std::int32_t splits : {1, 7, 1024})
    for (std::int64_t len : {0, 1, 100, 4096}) {
      named.splits = splits;
      const auto p = kc::detail::plan_decode(named, len, 16, 132);
      const auto q = kc::detail::plan_decode(named, len, 16, 132, true);
      CHECK(p.splits == std::min<std::int64_t>(splits, std::max<std::int64_t>(1, (len + 15) / 16)));
      CHECK(q.splits == p.splits);
      CHECK(std::int64_t{p.splits} * p.chunk >= len);
      CHECK(std::int64_t{q.splits} * q.chunk >= len);
    }
  // the split plan covers every entry: chunks of whole pages, at least 256 entries unless the head is shorter
  for (std::int64_t len : {0, 1, 255, 256, 257, 4096, 70001, 1 << 22}) {
    const auto p = kc::detail::plan_decode(a, len, 16, 132);
    CHECK(p.splits >= 1);
    CHECK(p.chunk % 16 == 0);
    CHECK(std::int64_t{p.splits} * p.chunk >= len);
    CHECK(p.group_tiles == 1);
    // the tensor-core kernel's plan: fewer or as many splits (the workspace is sized by the first)
    const auto q = kc::detail::plan_decode(a, len, 16, 132, true);
    CHECK(q.splits >= 1);
    CHECK(q.splits <= p.splits);
    CHECK(q.chunk % 16 == 0);
    CHECK(std::int64_t{q.splits} * q.chunk >= len);
    // ... chunks of 512 entries or more, in one wave of its blocks (2 a multiprocessor) unless
    // chunks of 8,192 entries need more
    CHECK(q.splits <= std::max<std::int64_t>(2 * 132, (len + 8191) / 8192));
    CHECK((q.splits == 1 || q.chunk >= 512));
  }
}
