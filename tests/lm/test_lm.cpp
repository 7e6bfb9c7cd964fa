// kvpolicy-lm on the real model (SmolLM2-135M, tools/fetch-model.sh; the directory comes in
// KVPOLICY_LM_MODEL, set by tests/lm/with_model.sh):
// - the tokenizer gives back every byte of a text, and llama.cpp's ids (golden file);
// - every policy, at a budget the text never reaches, gives logits bit-identical to the full cache
//   (the gated ones with gate files of the right shapes, written here: no trained gates exist for
//   this model);
// - at a small budget every policy evicts, holds what its rule allows, and still predicts text.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>

#include "evaluate.hpp"
#include "policies.hpp"
#include "tokenizer.hpp"

using namespace kvpolicy;
using namespace kvpolicy::lm;

namespace {

std::string model_dir() {
  const char* d = std::getenv("KVPOLICY_LM_MODEL");
  return d == nullptr ? "" : d;
}

const Model& model() {
  static const Model m = Model::load(model_dir());
  return m;
}

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::load(model_dir() + "/tokenizer.json");
  return t;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const std::string kText = "/usr/share/common-licenses/GPL-3";

std::vector<int> text_tokens(std::size_t n) {
  auto ids = tokenizer().encode(read(kText));
  REQUIRE(ids.size() >= n);
  ids.resize(n);
  return ids;
}

// Whether a registered policy takes any option (the full cache takes none: it has no budget a text could reach).
bool without_options(std::string_view name) {
  return registry::visit(name, []<registry::Policy P>() { return std::size(P::options) == 0; });
}

// The file a gated policy's --gate takes, for this model (registry::example_gate: small random
// weights, every readout bias `level`: large keeps every entry, very negative drops what it may).
std::string example_gate(std::string_view policy, float level) {
  const Config& c = model().config;
  const std::string path =
      "lm_gate_" + std::string(policy) + "_" + std::to_string(static_cast<int>(level)) + ".safetensors";
  registry::example_gate(policy, path, {c.cache_shape(), c.hidden}, level);
  return path;
}

Run run_policy(const registry::Selection& o, const std::vector<int>& ids, std::int64_t chunk, std::int64_t prefill = 0) {
  Decoder dec(model());
  return with_policy(o, KvStorage::float32, model().config, 1, static_cast<std::int64_t>(ids.size()), [&](auto& cache, const EntryMetadata& meta) {
    const std::int64_t prompt = std::min<std::int64_t>(prefill > 0 ? prefill : chunk, std::ssize(ids));
    using CacheT = std::decay_t<decltype(cache)>;
    return score_text<CacheT>(dec, cache, meta, ids, prompt, chunk, true, {},
                              probe_tokens(meta, tokenizer(), std::span<const int>(ids).first(static_cast<std::size_t>(prompt))));
  });
}

}  // namespace

TEST_CASE("the tokenizer gives back every byte of a text") {
  const auto& tok = tokenizer();
  for (const std::string& text : {read(kText).substr(0, 6000), std::string("  Numbers 12345 and 3.14, tabs\t\tand\n\n\nnewlines;"
                                                                            " caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 10 "
                                                                            "\xe6\x97\xa5\xe6\x9c\xac it's we'll  ")}) {
    const auto ids = tok.encode(text);
    CHECK(tok.decode(ids) == text);
    for (std::size_t i = 0; i < ids.size(); ++i) CHECK(tok.decode(ids[i]) != "");
  }
  CHECK_THROWS_WITH(tok.encode("bad \xff byte"), doctest::Contains("not valid UTF-8 at byte 4"));
  // numbers stand alone, one digit per token (llama.cpp's smollm pre-tokenizer)
  const auto digits = tok.encode("2024");
  CHECK(digits.size() == 4);
}

TEST_CASE("every policy at a budget the text never reaches gives the full cache's logits, bit for bit") {
  const auto ids = text_tokens(96);
  const std::int64_t chunk = 16;
  registry::Selection full;
  full.policy = "full";
  const Run want = run_policy(full, ids, chunk);
  CHECK(want.evictions == 0);
  for (const auto policy_name : registry::names()) {
    const std::string name(policy_name);
    if (without_options(name)) continue;  // the full cache itself
    CAPTURE(name);
    registry::Selection o;
    o.policy = name;
    o.offer("budget", 128).offer("buffer", 16).offer("ratio", 0);  // > 96 tokens, none of the prompt: nothing is ever evicted
    if (registry::input_source(name).gated) o.set("gate", example_gate(name, 30.0f));  // every entry kept, every token admitted
    const Run got = run_policy(o, ids, chunk);
    CHECK(got.evictions == 0);
    CHECK(got.final_entries == want.final_entries);
    CHECK(got.logits.rows() == want.logits.rows());
    CHECK((got.logits.array() == want.logits.array()).all());
  }
}

TEST_CASE("at a small budget every policy evicts, holds what its rule allows, and still predicts the text") {
  const auto ids = text_tokens(160);
  const Config& c = model().config;
  const std::int64_t heads = c.cache_shape().heads_total(), chunk = 8, M = 32, B = 8;
  registry::Selection full;
  full.policy = "full";
  const double full_ppl = perplexity(run_policy(full, ids, chunk).nll, 1);
  for (const auto policy_name : registry::names()) {
    const std::string name(policy_name);
    if (without_options(name)) continue;  // the full cache itself
    CAPTURE(name);
    const registry::InputSource source = registry::input_source(name);
    registry::Selection o;
    o.policy = name;
    o.offer("budget", M).offer("buffer", B).offer("recency", 8).offer("local", M);  // WG-KV: only its local ring of M stays
    if (registry::takes(name, "window") && std::stod(registry::default_text(name, "window")) > M)
      o.set("window", M / 2);  // a window longer than the budget (KVzap's 128) would keep the whole text
    if (source.gated) o.set("gate", example_gate(name, -30.0f));  // beta, g, the score far below any threshold
    const bool compresses_prompt = registry::needs_prompt_length(name);  // SnapKV, AdaKV: the prompt only
    const bool reconstructs = source.probes;                             // KVzip: at its probe, after the prompt
    const std::int64_t prompt = compresses_prompt || reconstructs ? 64 : chunk;
    const Run got = run_policy(o, ids, chunk, prompt);
    const double ppl = perplexity(got.nll, 1);
    CAPTURE(ppl);
    CHECK(got.final_entries < 160 * heads);  // something was dropped
    if (compresses_prompt) {                 // the prompt (the first chunk) compressed once; decode keeps all
      CHECK(got.final_entries <= (160 - prompt + M) * heads);
    } else if (reconstructs) {  // floor(N r) of the prompt's N entries leave at the probe (r = 0.5); decode keeps all
      CHECK(got.final_entries == (160 - prompt) * heads + prompt * heads - prompt * heads / 2);
    } else {  // M + B - 1 per head after every step (DBTrimKV on the sum), or M and the step's tokens: the
              // budget K over generated tokens, WG-KV's local ring, KVzap's window
      CHECK(got.final_entries <= (M + std::max(B - 1, chunk)) * heads);
    }
    CHECK(std::isfinite(ppl));
    CHECK(ppl < 50.0 * full_ppl);  // a model that still reads the text, not noise (vocab 49152)
  }
}

TEST_CASE("epikv and hs-var score each token once from the two bands: every head keeps the same tokens") {
  const auto ids = text_tokens(160);
  const std::int64_t chunk = 8, K = 32;
  std::map<std::string, std::set<std::int32_t>> kept_by;
  for (const auto& [name, a, b] : {std::tuple{"epikv", 10, 21}, std::tuple{"hs-var", 10, 21}, std::tuple{"epikv", 2, 28}}) {
    const std::string label = std::string(name) + " " + std::to_string(a) + "," + std::to_string(b);
    CAPTURE(label);
    registry::Selection o;
    o.policy = name;
    o.set("budget", K);
    o.set("recency", 8);
    o.set("band-a", a);
    o.set("band-b", b);
    Decoder dec(model());
    with_policy(o, KvStorage::float32, model().config, 1, 160, [&](auto& cache, const EntryMetadata& meta) {
      cache.add_sequence(0, chunk);
      for (std::size_t n = 0; n < ids.size(); n += chunk)
        dec.step(cache, 0, std::span<const int>(ids).subspan(n, chunk), meta, nullptr);
      const CacheShape shape = cache.shape();
      std::set<std::int32_t> first;
      for (int l = 0; l < shape.layers; ++l)
        for (int h = 0; h < shape.kv_heads; ++h) {
          std::set<std::int32_t> kept;
          for (std::int64_t i = 0; i < cache.length(0, l, h); ++i) kept.insert(cache.entry(0, l, h, i).position);
          if (l == 0 && h == 0) first = kept;
          CHECK(kept == first);  // SPEC §4: one score per token, shared by every layer and head
        }
      CHECK(static_cast<std::int64_t>(first.size()) == chunk + K);  // the prompt plus K generated
      for (std::int32_t p = 0; p < chunk; ++p) CHECK(first.count(p) == 1);
      for (std::int32_t p = 160 - 8; p < 160; ++p) CHECK(first.count(p) == 1);  // R = 8 newest
      kept_by[label] = first;
    });
  }
  // the score comes from the hidden states the options name: other bands or the other variant keep
  // other tokens (K = 32 of 144 generated: neither keeps only the newest)
  CHECK(kept_by["epikv 10,21"] != kept_by["hs-var 10,21"]);
  CHECK(kept_by["epikv 10,21"] != kept_by["epikv 2,28"]);
  std::set<std::int32_t> newest;
  for (std::int32_t p = 0; p < chunk; ++p) newest.insert(p);
  for (std::int32_t p = 160 - K; p < 160; ++p) newest.insert(p);
  for (const auto& [label, kept] : kept_by) CHECK(kept != newest);
  registry::Selection bad;
  bad.policy = "epikv";
  bad.set("band-b", 31);
  CHECK_THROWS_WITH(run_policy(bad, ids, chunk), doctest::Contains("--band-b 31 must be hidden-state indices in [0, 30]"));
}

TEST_CASE("the GGUF's blocks dequantize to the F32 file's weights, bit for bit") {
  const Model& m = model();
  std::int64_t q4_1 = 0, q8_0 = 0;
  const auto check = [&](const Weight& w, const std::string& what) {
    CAPTURE(what);
    REQUIRE(!w.blocks.empty());
    REQUIRE(w.blocks.rows == w.dense.rows());
    REQUIRE(w.blocks.cols == w.dense.cols());
    (w.blocks.format == BlockFormat::q4_1 ? q4_1 : q8_0) += w.blocks.rows * w.blocks.cols;
    std::vector<float> row(static_cast<std::size_t>(w.blocks.cols));
    std::int64_t differ = 0;
    for (std::int64_t r = 0; r < w.blocks.rows; ++r) {
      w.blocks.dequantize_row(r, row.data());
      differ += std::memcmp(row.data(), w.dense.row(r).data(), row.size() * sizeof(float)) != 0;
    }
    CHECK(differ == 0);
  };
  check(m.embed, "token_embd");
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& w = m.layers[l];
    for (const auto& [name, weight] : {std::pair{"attn_q", &w.wq}, std::pair{"attn_k", &w.wk}, std::pair{"attn_v", &w.wv},
                                       std::pair{"attn_output", &w.wo}, std::pair{"ffn_gate", &w.w_gate},
                                       std::pair{"ffn_up", &w.w_up}, std::pair{"ffn_down", &w.w_down}})
      check(*weight, "blk." + std::to_string(l) + "." + name);
  }
  CHECK(q4_1 == 106168320);  // every layer's weights (SmolLM2-135M's GGUF)
  CHECK(q8_0 == 28311552);   // the tied embedding / output head
}

TEST_CASE("Q8 activations: each block's integer dot is exact, so a product is Σ w x̂ up to fp32 rounding") {
  // The oracle of quant_product_q8, in double from the same Q8Row: Σ_b d_b dx_b Σ q qx (+ m_b s_b
  // for Q4_1, s_b = dx Σ qx as stored), that is Σ w x̂ with x̂ = dx qx; over every row of a Q4_1 and a Q8_0 matrix of the
  // real model; random activations with a block of zeros and a block of one large value (the
  // rounding's edge cases). The error is fp32's on the terms summed (they cancel: m is near -7.5 d).
  const Model& m = model();
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal;
  for (const Weight* w : {&m.layers[3].w_down, &m.layers[0].wq, &m.embed}) {
    const QuantMatrix& W = w->blocks;
    CAPTURE(block_format_name(W.format));
    Matrix a(1, W.cols), out(1, W.rows);
    for (Eigen::Index c = 0; c < W.cols; ++c) a(0, c) = normal(rng) * (c % 7 == 0 ? 4.0f : 1.0f);
    a.block(0, 32, 1, 32).setZero();
    a(0, 70) = 1e4f;
    Q8Row x;
    quant_product_q8(a, W, out, 0, W.rows, false, x);
    const std::int64_t blocks = W.cols / 32;
    const auto half_at = [](const std::uint8_t* p) { return double(dtype::half_to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)))); };
    double worst = 0;
    std::vector<float> row(static_cast<std::size_t>(W.cols));
    for (std::int64_t r = 0; r < W.rows; ++r) {
      W.dequantize_row(r, row.data());
      double want = 0, magnitude = 0;
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::uint8_t* p = W.blocks.data() + r * W.row_bytes() + b * QuantMatrix::block_bytes(W.format);
        const double d = half_at(p), mm = W.format == BlockFormat::q4_1 ? half_at(p + 2) : 0.0;
        const double dx = x.scale[static_cast<std::size_t>(b)];
        const double sb = x.sum[static_cast<std::size_t>(b)];
        double iq = 0;
        for (int j = 0; j < 32; ++j) {  // the block's q from its weights w = d q + m (exact: q <= 15 or |q| <= 128)
          const double q = d != 0.0 ? std::round((row[static_cast<std::size_t>(b * 32 + j)] - mm) / d) : 0.0;
          iq += q * x.q[static_cast<std::size_t>(b * 32 + j)];
        }
        want += d * dx * iq + mm * sb;
        magnitude += std::abs(d * dx * iq) + std::abs(mm * sb);
      }
      worst = std::max(worst, std::abs(out(0, r) - want) / std::max(magnitude, 1e-30));
    }
    CAPTURE(worst);
    CHECK(worst < 1e-6);
  }
  // and the rounding itself: qx = round(x / dx) with dx = max|x| / 127, dx and dx Σ qx kept as fp16
  // (as ggml's block_q8_1), zeros for a block of zeros
  Q8Row x;
  std::vector<float> v(64, 0.0f);
  for (int j = 0; j < 32; ++j) v[static_cast<std::size_t>(j)] = static_cast<float>(j - 16) * 0.5f;
  x.quantize(v.data(), 64);
  CHECK(x.scale[0] == dtype::half_to_float(dtype::float_to_half(8.0f / 127.0f)));
  CHECK(x.q[0] == -127);
  CHECK(x.q[16] == 0);
  CHECK(x.q[31] == static_cast<std::int8_t>(std::nearbyint(7.5f * (127.0f / 8.0f))));
  std::int32_t sum_q = 0;
  for (int j = 0; j < 32; ++j) sum_q += x.q[static_cast<std::size_t>(j)];
  CHECK(x.sum[0] == dtype::half_to_float(dtype::float_to_half(8.0f / 127.0f * static_cast<float>(sum_q))));
  CHECK(x.scale[1] == 0.0f);
  for (int j = 32; j < 64; ++j) CHECK(x.q[static_cast<std::size_t>(j)] == 0);
}

namespace {
// The same 40 tokens teacher-forced (a 16-token prompt, then 24 one-token steps, the full cache),
// decoded from the blocks with `activations` and from the F32 weights: the largest |Δlogit| over
// every step and the steps whose top-1 token is the same.
std::pair<float, int> blocks_against_f32(DecodeActivations activations) {
  const Model f32 = Model::load(model_dir(), DecodeWeights::f32);
  REQUIRE(f32.layers[0].wq.blocks.empty());
  const auto ids = text_tokens(40);
  std::vector<Matrix> logits[2];
  for (int which = 0; which < 2; ++which) {
    Decoder dec(which == 0 ? model() : f32, {}, activations);
    registry::Selection full;
    full.policy = "full";
    with_policy(full, KvStorage::float32, model().config, 1, 40, [&](auto& cache, const EntryMetadata& meta) {
      cache.add_sequence(0, 16);
      Matrix out;
      for (std::size_t n = 0; n < ids.size(); n += n == 0 ? 16 : 1) {
        dec.step(cache, 0, std::span<const int>(ids).subspan(n, n == 0 ? 16 : 1), meta, &out, 1);
        logits[which].push_back(out);
      }
      return 0;
    });
  }
  REQUIRE(logits[0].size() == 25);
  float worst = 0.0f;
  int same_top1 = 0;
  for (std::size_t i = 0; i < logits[0].size(); ++i) {
    const Matrix& a = logits[0][i];
    const Matrix& b = logits[1][i];
    REQUIRE(a.cols() == b.cols());
    worst = std::max(worst, (a - b).cwiseAbs().maxCoeff());
    Eigen::Index ia = 0, ib = 0;
    a.row(0).maxCoeff(&ia);
    b.row(0).maxCoeff(&ib);
    same_top1 += ia == ib;
  }
  return {worst, same_top1};
}
}  // namespace

TEST_CASE("decode steps with Q8 activations stay close to decode steps from F32") {
  // llama.cpp's arithmetic rounds the activations: the logits move by that rounding, not by fp32's,
  // and the greedy choice stays the same.
  const auto [worst, same_top1] = blocks_against_f32(DecodeActivations::q8);
  CAPTURE(worst);
  CAPTURE(same_top1);
  CHECK(worst > 1e-3f);    // the rounding was applied
  CHECK(worst < 4.0f);     // over all 49,152 logits of 25 steps: 1.9 on 2026-11-26
  CHECK(same_top1 >= 23);  // 24 of 25 on 2026-11-26
}

TEST_CASE("decode steps from the blocks agree with decode steps from F32") {
  // fp32 activations: the weights are the same values (above); only the order of each dot
  // product's additions differs.
  const auto [worst, same_top1] = blocks_against_f32(DecodeActivations::f32);
  CAPTURE(worst);
  CHECK(worst > 0.0f);    // the blocks were read: the sums' order differs
  CHECK(worst < 1e-3f);   // and only that: fp32 rounding (7.1e-5 on 2026-11-23)
  CHECK(same_top1 == 25);
}

int main(int argc, char** argv) {
  if (model_dir().empty()) {
    std::fprintf(stderr, "test_lm: SKIPPED: KVPOLICY_LM_MODEL is not set (tests/lm/with_model.sh sets it)\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
