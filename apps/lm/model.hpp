// kvpolicy-lm's model: a LLaMA-family decoder's configuration and weights, as kvpolicy-gguf-to-lm
// writes them (config.json, model.safetensors: F32 under the GGUF tensor names;
// model.quant.safetensors: the GGUF's Q4_1/Q8_0 blocks, which decode steps read).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "kvpolicy/core/eigen.hpp"
#include <nlohmann/json.hpp>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/gate/safetensors.hpp"
#include "quant.hpp"

namespace kvpolicy::lm {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::VectorXf;

struct Config {
  int layers = 0, hidden = 0, ffn = 0, q_heads = 0, kv_heads = 0, head_dim = 0, rope_dim = 0, vocab = 0;
  std::int64_t context = 0;
  double rope_base = 10000.0;
  float rms_eps = 1e-5f;
  bool tied_output = true;
  std::string name;

  CacheShape cache_shape() const { return CacheShape{layers, kv_heads, q_heads, head_dim}; }

  static Config load(const std::string& path) {
    std::ifstream in(path);
    require(in.good(), "kvpolicy-lm: cannot open '", path, "' (make the model directory with tools/fetch-model.sh)");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      fail("kvpolicy-lm: '", path, "' is not valid JSON: ", e.what());
    }
    Config c;
    try {
      require(j.at("architecture") == "llama", "kvpolicy-lm: '", path, "': architecture ", j.at("architecture").dump(),
              " is not llama");
      require(j.at("rope_type") == "adjacent_pairs", "kvpolicy-lm: '", path, "': rope_type ", j.at("rope_type").dump(),
              " is not adjacent_pairs");
      c.layers = j.at("layers");
      c.hidden = j.at("hidden");
      c.ffn = j.at("ffn");
      c.q_heads = j.at("q_heads");
      c.kv_heads = j.at("kv_heads");
      c.head_dim = j.at("head_dim");
      c.rope_dim = j.at("rope_dim");
      c.vocab = j.at("vocab");
      c.context = j.at("context");
      c.rope_base = j.at("rope_base");
      c.rms_eps = j.at("rms_eps");
      c.tied_output = j.at("tied_output");
      c.name = j.value("name", "");
    } catch (const nlohmann::json::exception& e) {
      fail("kvpolicy-lm: '", path, "': ", e.what());
    }
    require(c.layers >= 1 && c.hidden >= 1 && c.ffn >= 1 && c.vocab >= 1, "kvpolicy-lm: '", path,
            "': layers, hidden, ffn and vocab must be >= 1");
    cache_shape_checked(c, path);
    require(c.head_dim * c.q_heads == c.hidden, "kvpolicy-lm: '", path, "': q_heads ", c.q_heads, " x head_dim ",
            c.head_dim, " != hidden ", c.hidden);
    require(c.rope_dim >= 2 && c.rope_dim <= c.head_dim && c.rope_dim % 2 == 0, "kvpolicy-lm: '", path,
            "': rope_dim ", c.rope_dim, " must be even and in [2, head_dim]");
    require(c.rope_base > 1.0 && c.rms_eps > 0.0f, "kvpolicy-lm: '", path, "': rope_base ", c.rope_base,
            " must be > 1 and rms_eps ", c.rms_eps, " > 0");
    return c;
  }

 private:
  static void cache_shape_checked(const Config& c, const std::string& path) {
    try {
      c.cache_shape().validate();
    } catch (const Error& e) {
      fail("kvpolicy-lm: '", path, "': ", e.what());
    }
  }
};

/// A weight matrix [out, in]: F32 for every product, and the GGUF's blocks (when loaded) for the
/// products of a few rows (decode steps), which are bound by the bytes of weights they read.
struct Weight {
  Matrix dense;
  QuantMatrix blocks;  // empty: F32 only
};

struct LayerWeights {
  Vector attn_norm, ffn_norm;                     // [D]
  Weight wq, wk, wv, wo, w_gate, w_up, w_down;    // [out, in]
};

/// Which weights the decode steps read.
enum class DecodeWeights {
  gguf,  ///< the GGUF's blocks where the model has them (model.quant.safetensors), F32 elsewhere
  f32    ///< F32 everywhere (prefill always reads F32)
};

struct Model {
  Config config;
  Weight embed;        // [V, D]: token embeddings, and the output head when tied
  Weight output;       // [V, D] when not tied; empty otherwise
  Vector output_norm;  // [D]
  std::vector<LayerWeights> layers;

  const Weight& head() const { return config.tied_output ? embed : output; }

  /// dir: config.json + model.safetensors (kvpolicy-gguf-to-lm), and with DecodeWeights::gguf its
  /// model.quant.safetensors. Every shape is checked.
  static Model load(const std::string& dir, DecodeWeights decode = DecodeWeights::gguf) {
    Model m;
    m.config = Config::load(dir + "/config.json");
    const Config& c = m.config;
    const auto f = safetensors::File::read(dir + "/model.safetensors");
    std::optional<safetensors::File> q;
    if (decode == DecodeWeights::gguf) {
      const std::string path = dir + "/model.quant.safetensors";
      std::error_code ec;
      require(std::filesystem::exists(path, ec), "kvpolicy-lm: '", path,
              "' is missing: convert the model again (tools/fetch-model.sh) or decode from F32 (--decode-weights f32)");
      q = safetensors::File::read(path);
    }
    const std::int64_t D = c.hidden, F = c.ffn, d = c.head_dim;
    const auto weight = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
      return Weight{matrix(f, name, rows, cols), q ? blocks(*q, name, rows, cols) : QuantMatrix{}};
    };
    m.embed = weight("token_embd.weight", c.vocab, D);
    if (!c.tied_output) m.output = weight("output.weight", c.vocab, D);
    m.output_norm = vector(f, "output_norm.weight", D);
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      m.layers.push_back(LayerWeights{vector(f, p + "attn_norm.weight", D), vector(f, p + "ffn_norm.weight", D),
                                      weight(p + "attn_q.weight", c.q_heads * d, D),
                                      weight(p + "attn_k.weight", c.kv_heads * d, D),
                                      weight(p + "attn_v.weight", c.kv_heads * d, D),
                                      weight(p + "attn_output.weight", D, c.q_heads * d),
                                      weight(p + "ffn_gate.weight", F, D), weight(p + "ffn_up.weight", F, D),
                                      weight(p + "ffn_down.weight", D, F)});
    }
    return m;
  }

 private:
  static Matrix matrix(const safetensors::File& f, const std::string& name, std::int64_t rows, std::int64_t cols) {
    const auto v = f.floats(name, {rows, cols}, true);
    return Eigen::Map<const Matrix>(v.data(), rows, cols);
  }
  // The tensor's ggml blocks (U8 [rows, row bytes], its type in the metadata); none when the
  // GGUF stored it as F32.
  static QuantMatrix blocks(const safetensors::File& q, const std::string& name, std::int64_t rows, std::int64_t cols) {
    if (!q.contains(name)) return {};
    const auto kind = q.metadata().find(name);
    require(kind != q.metadata().end() && (kind->second == "Q4_1" || kind->second == "Q8_0"), "kvpolicy-lm: '",
            q.source(), "': tensor '", name, "' has no ggml type Q4_1 or Q8_0 in the metadata");
    QuantMatrix m;
    m.format = kind->second == "Q4_1" ? BlockFormat::q4_1 : BlockFormat::q8_0;
    m.rows = rows;
    m.cols = cols;
    const safetensors::TensorInfo& info = q.info(name);
    require(info.dtype == safetensors::DType::U8 && info.shape == std::vector<std::int64_t>{rows, m.row_bytes()},
            "kvpolicy-lm: '", q.source(), "': tensor '", name, "' is ", safetensors::dtype_name(info.dtype), " ",
            safetensors::shape_string(info.shape), ", want U8 [", rows, ", ", m.row_bytes(), "] of ", kind->second, " blocks");
    const auto bytes = q.raw(name);
    m.blocks.assign(bytes.begin(), bytes.end());
    m.validate(name);
    return m;
  }
  static Vector vector(const safetensors::File& f, const std::string& name, std::int64_t n) {
    const auto v = f.floats(name, {n}, true);
    return Eigen::Map<const Vector>(v.data(), n);
  }
};

}  // namespace kvpolicy::lm
