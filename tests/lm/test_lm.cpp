// kvpolicy-lm on the real model (SmolLM2-135M, tools/fetch-model.sh; the directory comes in
// KVPOLICY_LM_MODEL, set by tests/lm/with_model.sh):
// - the tokenizer gives back every byte of a text, and llama.cpp's ids (golden file);
// - every policy, at a budget the text never reaches, gives logits bit-identical to the full cache
//   (the gated ones with gate files of the right shapes, written here: no trained gates exist for
//   this model);
// - at a small budget every policy evicts, holds what its rule allows, and still predicts text.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>

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

// Gate files of the right shapes for this model (SPEC §1-3 tensor names), random weights; `bias`
// sets the readouts' bias (large: every g and beta near 1).
std::string write_gate(const std::string& kind, float bias) {
  const Config& c = model().config;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  auto random = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& e : v) e = normal(rng);
    return v;
  };
  auto fill = [](std::int64_t n, float x) { return std::vector<float>(static_cast<std::size_t>(n), x); };
  safetensors::Writer w;
  const int H = c.kv_heads, D = c.hidden, d = c.head_dim;
  if (kind == "trimkv") {
    const int I = 32;
    for (int l = 0; l < c.layers; ++l) {
      const auto p = gate::RetentionGate::prefix(l);
      w.add_f32(p + "linear1.weight", {I, D}, random(I * D));
      w.add_f32(p + "linear1.bias", {I}, random(I));
      w.add_f32(p + "linear2.weight", {H, I}, random(H * I));
      w.add_f32(p + "bias", {H}, fill(H, bias));
    }
  } else if (kind == "dbtrimkv") {  // the authors' rg10 (SPEC §2): the tied readout under every layer's name
    const int I = 32;
    const auto w3 = random(H * I);
    for (int l = 0; l < c.layers; ++l) {
      const auto p = gate::Rg10Gate::prefix(l);
      w.add_f32(p + "linear1.weight", {I, D}, random(I * D));
      w.add_f32(p + "linear1.bias", {I}, random(I));
      w.add_f32(p + "linear2.weight", {I, I}, random(I * I));
      w.add_f32(p + "linear2.bias", {I}, random(I));
      w.add_f32(p + "linear3.weight", {H, I}, w3);
      w.add_f32(p + "bias", {H}, fill(H, bias));
    }
  } else {
    const int E = d;
    for (int l = 0; l < c.layers; ++l) {
      const auto p = gate::WriteGate::prefix(l);
      w.add_f32(p + "pre_norm.weight", {d}, fill(d, 1.0f));
      w.add_f32(p + "post_norm.weight", {d}, fill(d, 1.0f));
      w.add_f32(p + "w1.weight", {H, E, 2 * d}, random(std::int64_t{H} * E * 2 * d));
      w.add_f32(p + "w1.bias", {H, E}, random(H * E));
      w.add_f32(p + "w2.weight", {H, E}, random(H * E));
      w.add_f32(p + "w2.bias", {H}, fill(H, bias));
    }
  }
  const std::string path = "lm_gate_" + kind + "_" + std::to_string(static_cast<int>(bias)) + ".safetensors";
  w.write(path);
  return path;
}

Run run_policy(const PolicyOptions& o, const std::vector<int>& ids, std::int64_t chunk, std::int64_t prefill = 0) {
  Decoder dec(model());
  return with_policy(o, model().config, 1, static_cast<std::int64_t>(ids.size()), [&](auto& cache, const EntryMetadata& meta) {
    return score_text(dec, cache, meta, ids, prefill > 0 ? prefill : chunk, chunk, true);
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
  PolicyOptions full;
  const Run want = run_policy(full, ids, chunk);
  CHECK(want.evictions == 0);
  for (const auto& name : policy_names()) {
    if (name == "full") continue;
    CAPTURE(name);
    PolicyOptions o;
    o.name = name;
    o.budget = 128;  // > 96 tokens: nothing is ever evicted
    o.buffer = 16;
    if (name == "trimkv" || name == "dbtrimkv") o.gate = write_gate(name, 0.0f);
    if (name == "wgkv") o.gate = write_gate(name, 30.0f);  // g = 1: every token admitted
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
  PolicyOptions full;
  const double full_ppl = perplexity(run_policy(full, ids, chunk).nll, 1);
  for (const auto& name : policy_names()) {
    if (name == "full") continue;
    CAPTURE(name);
    PolicyOptions o;
    o.name = name;
    o.budget = M;
    o.buffer = B;
    o.recency = 8;
    if (name == "trimkv" || name == "dbtrimkv") o.gate = write_gate(name, 0.0f);
    if (name == "wgkv") {
      o.gate = write_gate(name, -30.0f);  // g = 1e-3 < tau: only the local ring stays
      o.local = M;
    }
    const std::int64_t prompt = name == "snapkv" ? 64 : chunk;  // SnapKV compresses the prompt only
    const Run got = run_policy(o, ids, chunk, prompt);
    const double ppl = perplexity(got.nll, 1);
    CAPTURE(ppl);
    CHECK(got.final_entries < 160 * heads);  // something was dropped
    if (name == "snapkv") {                  // the prompt (the first chunk) compressed once; decode keeps all
      CHECK(got.final_entries <= (160 - prompt + M) * heads);
    } else if (name == "kv-key" || name == "kv-val" || name == "lag-kv") {  // the prompt plus K generated
      CHECK(got.final_entries <= (chunk + M) * heads);
    } else if (name == "wgkv") {  // the W_local ring (and the step's tokens)
      CHECK(got.final_entries <= (M + chunk) * heads);
    } else {  // M + B - 1 per head after every step; DBTrimKV on the sum
      CHECK(got.final_entries <= (M + B - 1) * heads);
    }
    CHECK(std::isfinite(ppl));
    CHECK(ppl < 50.0 * full_ppl);  // a model that still reads the text, not noise (vocab 49152)
  }
}

int main(int argc, char** argv) {
  if (model_dir().empty()) {
    std::fprintf(stderr, "test_lm: KVPOLICY_LM_MODEL is not set (tests/lm/with_model.sh sets it)\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
