// kvpolicy-llama: llama.cpp's own graph and KV cache, bounded by a kvpolicy policy in its
// token-level (union) mode (SPEC §8). llama.cpp's cache cell holds one token's K/V for every kv head
// of a layer, so a token leaves every head at once: after every step the policy says which
// positions go, and they leave llama.cpp's memory through llama_memory_seq_rm. The policy's inputs
// come from llama.cpp's graph through its evaluation callback, each only where the policy reads it:
// a layer's normed input (`attn_norm-L`, for the retention gates), its values (`Vcur-L`) and, for a
// policy that ranks by attention, its rotated queries (`Qcur-L`). Keys are read from llama.cpp's own
// K cells (the step's for append(); any held position's for a policy that reads stored keys or the
// attention over them: KeyDiff, H2O, TOVA): the callback sees where each layer's keys are written
// (the `cache_k_lL` row writes and their cell indices). docs/integration.md walks through it.
#include <ggml-cpu.h>
#include <llama.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../common/layer_inputs.hpp"
#include "../common/run_flags.hpp"
#include "../common/survivors.hpp"
#include "kvpolicy/open.hpp"

using namespace kvpolicy;

namespace {

const char* kUsage = R"(kvpolicy-llama: a GGUF model through llama.cpp, its KV cache bounded by a kvpolicy policy

  kvpolicy-llama --model GGUF --text FILE [--tokens N] [--score-from K] [--policy P --budget M ...]
      per-token NLL of the first N tokens of FILE (no BOS added); the last line is `ppl <value>`
      over positions >= K. `logits <digest>` is an FNV-1a digest of every logit's bits: the same
      digest is the same logits. `survivors <digest>` is kvpolicy-lm's digest of what the policy
      keeps. --survivors F writes the positions llama.cpp's memory holds at the end, a line
      `layer head positions...` per (layer, kv head) (a cell holds every head: the lines agree).
      --check-memory reads llama.cpp's memory after every step and requires it to hold exactly
      the positions the policy keeps.
  kvpolicy-llama --model GGUF --prompt TEXT --generate N [--policy P ...]
      greedy continuation of the prompt (one step for the prompt, then one token a step)
  kvpolicy-llama --model GGUF --text FILE --tokens N --generate D [--policy P ...]
      the first N tokens of FILE in steps of --chunk, then D tokens greedily, one a step: a context of
      N tokens at any budget. `timing:` gives the context's and the decode's tokens/s apart.
  Without --policy llama.cpp runs alone (its full cache, no callback). With one, the policy runs
  in its token-level mode (SPEC §8: M tokens per sequence, L * Hkv * M entries) and llama.cpp's
  context holds M + B + the largest step's tokens (rounded up as llama.cpp pads it).

model:   --model GGUF      any model llama.cpp loads (the LLaMA family: its graph names the tensors read)
         --threads N       llama.cpp's threads, and the OpenMP threads of the policy's own work
                           between its steps (the gate's products, H2O's and TOVA's attention) (default 2)
steps:   --prefill P       the first step's tokens (default: --chunk)
         --chunk C         tokens per later step of a text (default 16); generation decodes 1
policy:  --policy P        a policy with a token-level mode (below); its options as --NAME VALUE
         --list-policies   the registered policies, one per line: name, options, inputs, prompt, device
         --list-options    every policy's options, defaults and values, as a Markdown table
)";

struct Args : apps::RunFlags {
  bool check_memory = false;
  Args() { threads = 2; }
};

Args parse(int argc, char** argv) {
  Args a;
  a.read(argc, argv, "kvpolicy-llama", kUsage, {{"--check-memory", &a.check_memory}},
         [](const std::string&, const std::string&) { return false; });
  require(a.threads >= 1, "--threads ", a.threads, " must be >= 1");
  a.finish("kvpolicy-llama", "GGUF", "");  // no policy: llama.cpp alone
  require(a.prompts.size() <= 1, "kvpolicy-llama runs one sequence: give one --prompt");
  require(a.survivors.empty() || !a.selection.policy.empty(), "--survivors needs --policy (llama.cpp alone keeps every token)");
  require(!a.check_memory || !a.selection.policy.empty(), "--check-memory needs --policy (llama.cpp alone removes nothing)");
  if (!a.selection.policy.empty()) {
    require(registry::contains(a.selection.policy), "--policy '", a.selection.policy, "' is not registered (known: ",
            registry::known(), ")");
    // llama.cpp's cells hold every kv head of a token: only the token-level mode applies
    require(registry::takes(a.selection.policy, "mode"), "--policy ", a.selection.policy,
            " has no token-level mode (SPEC §8), which llama.cpp's cache needs (policies with one: ",
            registry::takers("mode"), ")");
    require(!a.selection.given.contains("mode") || a.selection.given.at("mode") == "union", "--mode ",
            a.selection.given.count("mode") ? a.selection.given.at("mode") : "",
            ": llama.cpp's cells hold every kv head of a token, so kvpolicy-llama runs --mode union only");
    a.selection.set("mode", "union");
  }
  return a;
}

/// What a step's graph gave the callback, per layer: the normed input [T, D] and the queries
/// after RoPE and values as llama.cpp lays them out ([T, heads, d]), each only where the policy
/// reads it; and where llama.cpp keeps the keys (the keys themselves are read from its cells).
struct Captured {
  enum Kind { normed, queries, values, keys, kinds };  // keys: the rotated Kcur, for --check-memory alone
  std::vector<std::array<std::vector<float>, kinds>> layer;
  std::array<bool, kinds> wanted{};  ///< what the policy reads: each wanted tensor splits llama.cpp's graph there
  /// Each layer's K cells (cells x Hkv*d of `type`, a row `row_bytes` apart): fixed once the
  /// context is made, taken from the layer's first row write.
  struct KeyCells {
    const char* base = nullptr;
    std::size_t row_bytes = 0;
    std::int64_t row_elements = 0;
    ggml_type type = GGML_TYPE_COUNT;
  };
  std::vector<KeyCells> key_cells;
  /// The cells this step's tokens were written to: one index input serves every layer's write
  /// (llama-graph.cpp, self_k_idxs), read at layer 0's; emptied once the step's keys are read.
  std::vector<std::int64_t> step_cells;
  std::string error;  ///< what the callback could not take (it must not throw through llama.cpp)
};

/// The row write of layer L's keys into llama.cpp's K cells (ggml_set_rows into `cache_k_lL`,
/// llama-kv-cache.cpp cpy_k): the cells' address and layout, and at layer 0 the cells written.
/// Wanted at layer 0 every step, at another layer until its cells are known. False where `t` is none.
bool capture_key_cells(ggml_tensor* t, const char* name, bool ask, bool& wanted, Captured& c) {
  int layer = -1, used = 0;
  if (c.key_cells.empty() || t->op != GGML_OP_SET_ROWS || std::sscanf(name, "cache_k_l%d (view)%n", &layer, &used) != 1 ||
      name[used] != '\0' || layer < 0 || layer >= static_cast<int>(c.key_cells.size()))
    return false;
  auto& k = c.key_cells[static_cast<std::size_t>(layer)];
  wanted = layer == 0 || k.base == nullptr;
  if (ask || !wanted) return true;
  const ggml_tensor* cells = t->src[2];  // ggml_set_rows: src[0] the rows, src[1] their indices, src[2] the destination
  const ggml_tensor* index = t->src[1];
  if (!cells || !index || !cells->buffer || !ggml_backend_buffer_is_host(cells->buffer) || !index->buffer ||
      !ggml_backend_buffer_is_host(index->buffer) || index->type != GGML_TYPE_I64 || cells->ne[2] != 1 ||
      index->ne[1] != 1) {
    c.error = std::string(name) + " is not one stream's K cells in host memory written at I64 cell indices";
    return true;
  }
  k.base = static_cast<const char*>(cells->data);
  k.row_bytes = cells->nb[1];
  k.row_elements = cells->ne[0];
  k.type = cells->type;
  if (layer == 0) {
    const auto* at = static_cast<const std::int64_t*>(index->data);
    c.step_cells.assign(at, at + index->ne[0]);
  }
  return true;
}

/// llama.cpp's evaluation callback (ggml_backend_sched_eval_callback): asked first whether a
/// tensor is wanted, then called with its data once computed; every wanted tensor ends a part of
/// the graph llama.cpp computes apart, so only what the policy reads is asked for. The LLaMA graph
/// names a layer's tensors NAME-L exactly (views of them get suffixes), some twice: `Qcur-L` names
/// (and `Kcur-L`) the projection and then its rotation (GGML_OP_ROPE, the one taken), `Vcur-L` the projection and
/// then its reshape (a view of the same values, not taken). Nothing may throw through llama.cpp's
/// C code: a problem is recorded, the computation stopped (return false), and run_steps reports it.
bool capture(ggml_tensor* t, bool ask, void* user) {
  auto& c = *static_cast<Captured*>(user);
  const char* name = ggml_get_name(t);
  bool wanted = false;
  if (capture_key_cells(t, name, ask, wanted, c)) return ask ? wanted : c.error.empty();
  char base[32] = {0};
  int layer = -1, used = 0;
  if (std::sscanf(name, "%31[^-]-%d%n", base, &layer, &used) != 2 || name[used] != '\0' || layer < 0 ||
      layer >= static_cast<int>(c.layer.size()))
    return !ask;
  const std::string b(base);
  const bool view = t->op == GGML_OP_VIEW || t->op == GGML_OP_RESHAPE || t->op == GGML_OP_PERMUTE || t->op == GGML_OP_TRANSPOSE;
  int kind = -1;
  if (b == "attn_norm") kind = Captured::normed;
  else if (b == "Vcur" && !view) kind = Captured::values;
  else if (b == "Qcur" && t->op == GGML_OP_ROPE) kind = Captured::queries;
  else if (b == "Kcur" && t->op == GGML_OP_ROPE) kind = Captured::keys;
  if (kind < 0 || !c.wanted[static_cast<std::size_t>(kind)]) return !ask;
  if (ask) return true;
  if (t->type != GGML_TYPE_F32 || t->nb[0] != sizeof(float) || !t->buffer || !ggml_backend_buffer_is_host(t->buffer)) {
    c.error = std::string(name) + " is not F32 rows in host memory";
    return false;
  }
  // row by row, whatever its strides: [ne0] rows over ne1 x ne2 x ne3, in that order
  auto& out = c.layer[static_cast<std::size_t>(layer)][static_cast<std::size_t>(kind)];
  out.resize(static_cast<std::size_t>(ggml_nelements(t)));
  float* to = out.data();
  for (std::int64_t i3 = 0; i3 < t->ne[3]; ++i3)
    for (std::int64_t i2 = 0; i2 < t->ne[2]; ++i2)
      for (std::int64_t i1 = 0; i1 < t->ne[1]; ++i1, to += t->ne[0])
        std::memcpy(to, static_cast<const char*>(t->data) + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3],
                    static_cast<std::size_t>(t->ne[0]) * sizeof(float));
  return true;
}

/// [T, H, d] (llama.cpp's order) -> [H, T, d] (the Cache's).
void heads_first(const std::vector<float>& in, std::int64_t T, std::int64_t H, std::int64_t d, std::vector<float>& out) {
  require(static_cast<std::int64_t>(in.size()) == T * H * d, "a captured tensor holds ", in.size(),
          " values, not T * H * d = ", T * H * d);
  out.resize(in.size());
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h)
      std::copy_n(&in[static_cast<std::size_t>((t * H + h) * d)], d, &out[static_cast<std::size_t>((h * T + t) * d)]);
}

/// The model, its context, and the threads llama.cpp computes on: one pool for the whole run
/// (llama_attach_threadpool, as llama.cpp's own tools attach one), with or without a policy. Without
/// it ggml starts and joins a pool for every part of the graph it computes apart, which the
/// evaluation callback makes many of a step.
struct Model {
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  ggml_threadpool* threads = nullptr;
  ~Model() {
    if (ctx) llama_free(ctx);
    if (threads) ggml_threadpool_free(threads);
    if (model) llama_model_free(model);
  }
};

std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text, std::int64_t limit) {
  std::vector<llama_token> ids(text.size() + 8);
  int n = llama_tokenize(vocab, text.data(), static_cast<std::int32_t>(text.size()), ids.data(),
                         static_cast<std::int32_t>(ids.size()), /*add_special=*/false, /*parse_special=*/false);
  require(n >= 0, "llama_tokenize failed (", n, ")");
  ids.resize(static_cast<std::size_t>(std::min<std::int64_t>(n, limit)));
  return ids;
}

/// The positions llama.cpp's memory holds for sequence 0, ascending, read from llama.cpp itself:
/// llama_state_seq_get_data writes a magic number and the sequence id (llama-context.cpp), then the
/// KV cache's stream count and per stream its cell count and, per cell, the position and sequence
/// ids before the cells' K/V (llama-kv-cache.cpp, state_write_meta), in the pinned release; a LLaMA
/// model has no per-cell extension. What does not parse so is an error, never a guess.
std::vector<std::int32_t> memory_positions(llama_context* ctx, std::vector<std::uint8_t>& state) {
  state.resize(llama_state_seq_get_size(ctx, 0));
  require(llama_state_seq_get_data(ctx, state.data(), state.size(), 0) == state.size(),
          "llama_state_seq_get_data wrote less than llama_state_seq_get_size said");
  std::size_t at = 0;
  const auto read = [&](auto& x) {
    require(at + sizeof x <= state.size(), "llama.cpp's sequence state ends inside its cell list (", state.size(),
            " bytes)");
    std::memcpy(&x, state.data() + at, sizeof x);
    at += sizeof x;
  };
  std::uint32_t magic = 0, streams = 0, cells = 0, seqs = 0;
  std::int32_t seq = -1;
  read(magic);
  require(magic == 0xaf143cd8u, "llama.cpp's sequence state begins with ", magic, ", not the pinned release's magic");
  read(seq);
  require(seq == 0, "llama.cpp's sequence state is sequence ", seq, "'s, not 0's");
  read(streams);
  require(streams == 1, "llama.cpp's memory has ", streams, " streams; this program reads one");
  read(cells);
  std::vector<std::int32_t> held(cells);
  for (std::int32_t& p : held) {
    read(p);
    read(seqs);
    require(seqs == 1, "a cell of sequence 0 names ", seqs, " sequences in llama.cpp's state; expected 1");
    read(seq);
    require(seq == 0, "a cell of sequence 0 names sequence ", seq, " in llama.cpp's state");
  }
  std::sort(held.begin(), held.end());
  require(std::adjacent_find(held.begin(), held.end()) == held.end(), "llama.cpp's memory holds a position twice");
  return held;
}

struct Fnv {
  std::uint64_t h = 1469598103934665603ull;
  void add(const float* x, std::size_t n) {
    const auto* b = reinterpret_cast<const unsigned char*>(x);
    for (std::size_t i = 0; i < n * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
};

/// One llama.cpp step: tokens at positions first .. first + T - 1 of sequence 0, every position's
/// logits kept; a refusal of the callback or of llama_decode is an error naming the position.
void decode_step(Model& m, const Captured& cap, llama_batch& batch, const llama_token* tokens, std::int64_t T,
                 std::int64_t first) {
  batch.n_tokens = static_cast<std::int32_t>(T);
  for (std::int64_t i = 0; i < T; ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = static_cast<llama_pos>(first + i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  const int rc = llama_decode(m.ctx, batch);
  // the pool's threads stop polling for work: the policy's own threads run next (core/parallel.hpp)
  ggml_threadpool_pause(m.threads);
  require(cap.error.empty(), "the evaluation callback at position ", first, ": ", cap.error);
  require(rc == 0, "llama_decode failed at position ", first, " (", rc,
          rc == 1 ? ": no free cell in llama.cpp's context" : "", ")");
}

/// The run: llama.cpp decodes `ids` in steps, then `generate` tokens greedily one a step; after
/// each step the policy (if any) evicts and the evicted positions leave llama.cpp's memory.
/// on_logits(first position, T) reads a text step's logits; on_context() marks the text's end.
template <class Policy, class OnLogits, class OnContext>
void run_steps(const Args& a, Model& m, const Captured& cap, Policy* policy, const std::vector<llama_token>& ids,
               std::int64_t prefill, int n_vocab, std::vector<llama_token>& generated, OnLogits&& on_logits,
               OnContext&& on_context) {
  const auto N = static_cast<std::int64_t>(ids.size());
  llama_batch batch = llama_batch_init(static_cast<std::int32_t>(std::max(prefill, a.chunk)), 0, 1);
  std::unique_ptr<llama_batch, void (*)(llama_batch*)> hold(&batch, [](llama_batch* b) { llama_batch_free(*b); });
  for (std::int64_t n = 0; n < N;) {
    const std::int64_t T = std::min(n == 0 ? prefill : a.chunk, N - n);
    decode_step(m, cap, batch, &ids[static_cast<std::size_t>(n)], T, n);
    on_logits(n, T);
    if (policy) (*policy)(T);
    n += T;
  }
  on_context();
  const llama_vocab* vocab = llama_model_get_vocab(m.model);
  for (std::int64_t at = N; at < N + a.generate; ++at) {
    const float* logits = llama_get_logits_ith(m.ctx, -1);
    const auto best = static_cast<llama_token>(std::max_element(logits, logits + n_vocab) - logits);
    if (llama_vocab_is_eog(vocab, best)) break;
    generated.push_back(best);
    decode_step(m, cap, batch, &best, 1, at);
    if (policy) (*policy)(1);
  }
}

/// llama.cpp's keys as the policy reads them, from its K cells: the step's keys for append() (the
/// values llama.cpp's attention reads, in its cells' type) and, for a policy that reads stored keys
/// or the attention over them, EngineKeys (SPEC §9). It keeps the cell each position the policy
/// holds was written to: llama.cpp neither moves a cell nor reuses one before llama_memory_seq_rm
/// frees it (no K-shift without llama_memory_seq_add, no defragmentation, no sliding window: run()
/// refuses a model with one).
struct LlamaKeys {
  Captured& cap;
  CacheShape shape;
  std::unordered_map<std::int32_t, std::int64_t> cell_of{};  // held positions only: at most the context's cells
  std::vector<std::int64_t> cells{};                         // the step's tokens'

  /// The step's T tokens at positions first.. were written to the cells layer 0's write names.
  void written(std::int64_t first, std::int64_t T) {
    require(static_cast<std::int64_t>(cap.step_cells.size()) == T, "the step at position ", first, " wrote ",
            cap.step_cells.size(), " of llama.cpp's K cells, not its ", T, " tokens'");
    cells.swap(cap.step_cells);
    cap.step_cells.clear();  // the next step's write must be seen again
    for (int l = 0; l < shape.layers; ++l) {
      const auto& k = cap.key_cells[static_cast<std::size_t>(l)];
      require(k.base != nullptr, "layer ", l, "'s write into llama.cpp's K cells was not seen");
      require(k.row_elements == std::int64_t{shape.kv_heads} * shape.head_dim, "layer ", l, "'s K cells hold ",
              k.row_elements, " values a row, not Hkv * d = ", std::int64_t{shape.kv_heads} * shape.head_dim);
      require(k.type == GGML_TYPE_F16 || k.type == GGML_TYPE_F32 || k.type == GGML_TYPE_BF16, "llama.cpp's K cells are ",
              ggml_type_name(k.type), "; kvpolicy-llama reads F16, F32 or BF16 cells");
    }
    for (std::int64_t t = 0; t < T; ++t) cell_of[static_cast<std::int32_t>(first + t)] = cells[static_cast<std::size_t>(t)];
  }
  void freed(const PositionRun& r) {
    for (std::int64_t p = r.first; p < r.end; ++p) cell_of.erase(static_cast<std::int32_t>(p));
  }
  KeyType key_type() const {
    const ggml_type type = cap.key_cells.front().type;
    return type == GGML_TYPE_F16 ? KeyType::float16 : type == GGML_TYPE_F32 ? KeyType::float32 : KeyType::bfloat16;
  }
  const char* row(int layer, std::int64_t cell, int kv_head) const {
    const auto& k = cap.key_cells[static_cast<std::size_t>(layer)];
    return k.base + static_cast<std::size_t>(cell) * k.row_bytes +
           static_cast<std::size_t>(kv_head) * ggml_type_size(k.type) * static_cast<std::size_t>(shape.head_dim);
  }
  /// Layer l's keys of the step's T tokens, [Hkv, T, d] in fp32.
  void step_keys(int l, std::int64_t T, std::vector<float>& out) const {
    const std::int64_t H = shape.kv_heads, d = shape.head_dim;
    out.resize(static_cast<std::size_t>(H * T * d));
    memory::with_key_type(key_type(), [&]<class K>(std::type_identity<K>) {
      for (int h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < T; ++t) {
          const auto* r = reinterpret_cast<const K*>(row(l, cells[static_cast<std::size_t>(t)], h));
          for (std::int64_t c = 0; c < d; ++c) out[static_cast<std::size_t>((h * T + t) * d + c)] = to_float(r[c]);
        }
    });
  }
  /// Where a held position's key is.
  EngineKeys keys() const {
    return {key_type(), [this](std::int64_t seq, int layer, int kv_head, std::int32_t position) -> const void* {
              const auto it = cell_of.find(position);
              return seq != 0 || it == cell_of.end() ? nullptr : row(layer, it->second, kv_head);
            }};
  }
};

/// The policy's side of a step: its inputs from what the callback captured, appended to a kvpolicy
/// Cache in token-level mode, committed; the positions it evicts leave llama.cpp's memory, a run of
/// consecutive positions per llama_memory_seq_rm. Over llama.cpp's own K/V (the Cache's storage
/// engine_owned) the Cache keeps each entry's metadata only and takes no values; a policy that reads
/// stored keys or the attention over them reads llama.cpp's cells (`llama_keys`), and one that ranks by
/// attention is shown each layer's queries (observe) while llama.cpp attends.
struct Evicting {
  AnyCache& cache;
  const inputs::Producer& producer;
  Captured& cap;
  Model& m;
  CacheShape shape;
  int hidden;
  bool check_memory;
  LlamaKeys& llama_keys;
  std::int64_t held_max = 0, evicted_positions = 0, steps_checked = 0, next_position = 0;
  std::vector<float> log_beta{}, keys{}, values{}, queries{}, rotated{};
  double policy_seconds = 0.0;  ///< the policy's per-step work: inputs, gate, append, scores, selection, removal
  std::vector<EvictedEntry> evicted{};
  std::vector<std::uint8_t> state{};
  std::vector<std::int32_t> kept{};

  /// --check-memory: the keys read from llama.cpp's cells are its rotated keys of the step as its
  /// cells' type holds them, bit for bit (the cells are the ones written).
  void check_keys(int l, std::int64_t T) {
    const std::int64_t H = shape.kv_heads, d = shape.head_dim;
    heads_first(cap.layer[static_cast<std::size_t>(l)][Captured::keys], T, H, d, rotated);
    memory::with_key_type(llama_keys.key_type(), [&]<class K>(std::type_identity<K>) {
      for (std::size_t i = 0; i < rotated.size(); ++i)
        require(dtype::float_bits(to_float(from_float<K>(rotated[i]))) == dtype::float_bits(keys[i]), "layer ", l,
                ": the key read from llama.cpp's cell (", keys[i], ") is not the step's rotated key (", rotated[i],
                ") at flat index ", i, " of the step ending at position ", next_position - 1);
    });
  }

  /// --check-memory: llama.cpp's memory holds exactly the positions every (layer, kv head) of the
  /// policy keeps (SPEC §8: one decision per position), and its own min and max say the same.
  void check() {
    const std::vector<std::int32_t> held = memory_positions(m.ctx, state);
    for (int l = 0; l < shape.layers; ++l)
      for (int h = 0; h < shape.kv_heads; ++h) {
        kept.clear();
        for (std::int64_t i = 0; i < cache.length(0, l, h); ++i) kept.push_back(cache.entry(0, l, h, i).position);
        std::sort(kept.begin(), kept.end());
        if (kept == held) continue;
        const auto diff = std::mismatch(held.begin(), held.end(), kept.begin(), kept.end());
        fail("after the step ending at position ", next_position - 1, " llama.cpp holds ", held.size(),
             " positions and head (", l, ", ", h, ") of the policy keeps ", kept.size(), "; the first difference: ",
             diff.first == held.end() ? std::string("none in llama.cpp") : std::to_string(*diff.first),
             " against ", diff.second == kept.end() ? std::string("none in the policy") : std::to_string(*diff.second));
      }
    llama_memory_t memory = llama_get_memory(m.ctx);
    require(!held.empty() && llama_memory_seq_pos_min(memory, 0) == held.front() &&
                llama_memory_seq_pos_max(memory, 0) == held.back(),
            "llama_memory_seq_pos_min/max (", llama_memory_seq_pos_min(memory, 0), ", ",
            llama_memory_seq_pos_max(memory, 0), ") disagree with the positions llama.cpp's state lists");
    ++steps_checked;
  }

  void operator()(std::int64_t T) {
    const auto t0 = std::chrono::steady_clock::now();
    llama_keys.written(next_position, T);
    if (next_position == 0 && cache.reads_stored_kv())
      cache.use_engine_keys(llama_keys.keys());  // the first step showed the cells' type
    next_position += T;
    const std::int64_t H = shape.kv_heads, d = shape.head_dim;
    const auto& needs = producer.needs();
    for (int l = 0; l < shape.layers; ++l) {
      auto& c = cap.layer[static_cast<std::size_t>(l)];
      llama_keys.step_keys(l, T, keys);
      if (check_memory) check_keys(l, T);
      if (needs.values) heads_first(c[Captured::values], T, H, d, values);
      log_beta.assign(static_cast<std::size_t>(H * T), 0.0f);
      if (needs.per_layer()) {
        require(static_cast<std::int64_t>(c[Captured::normed].size()) == T * hidden,
                "attn_norm-", l, " was not captured for ", T, " tokens");
        apps::layer_inputs(producer, 0, l,
                           {c[Captured::normed].data(), nullptr, keys.data(), needs.values ? values.data() : nullptr},
                           shape, hidden, T, log_beta.data());
      }
      cache.append(0, l, View<const float, 3>(keys.data(), {H, T, d}),
                   needs.values ? View<const float, 3>(values.data(), {H, T, d}) : View<const float, 3>{},
                   View<const float, 2>(log_beta.data(), {H, T}));
      if (cap.wanted[Captured::queries]) {  // llama.cpp attended over its cells; the policy records what it ranks by
        heads_first(c[Captured::queries], T, shape.q_heads, d, queries);
        cache.observe(0, l, View<const float, 3>(queries.data(), {shape.q_heads, T, d}));
      }
    }
    // what llama.cpp holds before the step's eviction: its own count where checked
    held_max = std::max<std::int64_t>(held_max, check_memory ? static_cast<std::int64_t>(memory_positions(m.ctx, state).size())
                                                             : cache.length(0, 0, 0));
    evicted.clear();
    cache.commit(0, &evicted);
    // SPEC §8: every head lost the same positions; each run leaves llama.cpp's cells at once
    for (const PositionRun& r : token_runs(evicted)) {
      require(llama_memory_seq_rm(llama_get_memory(m.ctx), 0, r.first, r.end), "llama_memory_seq_rm(0, ", r.first,
              ", ", r.end, ") failed");
      evicted_positions += r.end - r.first;
      llama_keys.freed(r);
    }
    policy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (check_memory) check();
  }
};

double log_softmax_at(const float* logits, int vocab, int id) {
  double mx = logits[0];
  for (int i = 1; i < vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double s = 0.0;
  for (int i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(logits[i]) - mx);
  return static_cast<double>(logits[id]) - mx - std::log(s);
}

int run(const Args& a) {
  llama_backend_init();
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
  }, nullptr);
  Model m;
  llama_model_params mp = llama_model_default_params();
  m.model = llama_model_load_from_file(a.model.c_str(), mp);
  require(m.model != nullptr, "llama.cpp cannot load ", a.model);
  const llama_vocab* vocab = llama_model_get_vocab(m.model);
  const int layers = llama_model_n_layer(m.model), q_heads = llama_model_n_head(m.model),
            kv_heads = llama_model_n_head_kv(m.model), hidden = llama_model_n_embd(m.model);
  const int d = hidden / q_heads;
  const CacheShape shape{layers, kv_heads, q_heads, d};
  // the policy reads each held position's key from the cell it was written to; a sliding-window
  // model's cache reuses the cells of positions outside its window, which the policy may still hold
  require(a.selection.policy.empty() || llama_model_n_swa(m.model) == 0, a.model, " attends over a sliding window of ",
          llama_model_n_swa(m.model), " tokens, whose cache reuses cells the policy may hold; kvpolicy-llama runs models without one");

  std::vector<llama_token> ids;
  if (!a.text.empty()) ids = tokenize(vocab, apps::read_file("--text", a.text), a.tokens);
  else ids = tokenize(vocab, a.prompts.front(), 1 << 30);
  require(!a.prompts.empty() || static_cast<std::int64_t>(ids.size()) == a.tokens, "--tokens ", a.tokens, ": '", a.text,
          "' has only ", ids.size(), " tokens");
  const std::int64_t N = static_cast<std::int64_t>(ids.size());
  require(N >= 1, "--prompt: '", a.prompts.empty() ? std::string() : a.prompts.front(), "' has no tokens");
  const std::int64_t prefill = a.prompts.empty() ? a.prefill : N;
  const std::int64_t total = N + a.generate;
  const std::int64_t largest_step = std::max(prefill, a.chunk);

  Captured cap;
  cap.layer.resize(static_cast<std::size_t>(layers));
  const bool with_policy = !a.selection.policy.empty();
  llama_context_params cp = llama_context_default_params();
  cp.n_batch = cp.n_ubatch = static_cast<std::uint32_t>(largest_step);
  cp.n_threads = cp.n_threads_batch = a.threads;
#ifdef _OPENMP
  omp_set_num_threads(a.threads);  // the gate's products, the attention (core/parallel.hpp): between llama.cpp's steps
#endif
  cp.no_perf = true;
  std::int64_t budget = 0, buffer = 0;
  if (with_policy) {
    budget = std::stoll(a.selection.value("budget"));
    buffer = std::stoll(a.selection.value("buffer"));
    // the most positions held: M + B - 1 between evictions, plus one step's tokens before its commit
    cp.n_ctx = static_cast<std::uint32_t>(std::min<std::int64_t>(budget + buffer - 1 + largest_step, total + 1));
    cp.cb_eval = capture;
    cp.cb_eval_user_data = &cap;
  } else {
    cp.n_ctx = static_cast<std::uint32_t>(total + 1);
  }
  m.ctx = llama_init_from_model(m.model, cp);
  require(m.ctx != nullptr, "llama.cpp cannot make a context of ", cp.n_ctx, " cells");
  ggml_threadpool_params pool = ggml_threadpool_params_default(a.threads);
  m.threads = ggml_threadpool_new(&pool);
  require(m.threads != nullptr, "ggml cannot start a pool of ", a.threads, " threads");
  llama_attach_threadpool(m.ctx, m.threads, m.threads);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  // llama.cpp's K/V: n_ctx cells of L layers x Hkv heads x d, F16 keys and values
  const double kv_mib = static_cast<double>(llama_n_ctx(m.ctx)) * layers * kv_heads * d * 2 * 2 / (1024.0 * 1024.0);

  double nll_sum = 0.0;
  std::int64_t scored = 0;
  Fnv digest;
  std::vector<llama_token> generated;
  const auto on_logits = [&](std::int64_t n, std::int64_t T) {
    for (std::int64_t i = 0; i < T; ++i) {
      const float* logits = llama_get_logits_ith(m.ctx, static_cast<std::int32_t>(i));
      digest.add(logits, static_cast<std::size_t>(n_vocab));
      const std::int64_t next = n + i + 1;
      if (next < N && next >= a.score_from && a.prompts.empty()) {
        nll_sum -= log_softmax_at(logits, n_vocab, ids[static_cast<std::size_t>(next)]);
        ++scored;
      }
    }
  };

  const auto t0 = std::chrono::steady_clock::now();
  auto t_context = t0;
  std::int64_t held_max = 0, evicted = 0, steps_checked = 0;
  std::vector<std::int64_t> survivors;
  double policy_mib = 0.0, policy_seconds = 0.0;  // the policy's Cache, and its per-step work
  std::string policy_holds;
  std::string mode_line = "none (llama.cpp alone)";
  const auto go = [&](auto* policy) {
    run_steps(a, m, cap, policy, ids, prefill, n_vocab, generated, on_logits,
              [&] { t_context = std::chrono::steady_clock::now(); });
  };
  if (!with_policy) {
    go(static_cast<std::function<void(std::int64_t)>*>(nullptr));
  } else {
    registry::Selection given = a.selection;  // a token-level mode, --mode union: parse() made sure
    given.describe_model("rope-layout", "adjacent");  // llama.cpp's LLaMA keys pair components adjacently
    // every head holds what llama.cpp's context holds: at most M + B - 1 + one step, or the text.
    // The Cache is over llama.cpp's own K/V (SPEC §9): it keeps each entry's metadata, and a
    // policy that reads keys or the attention over them reads llama.cpp's cells.
    const std::int64_t pages = pages_for(shape, std::min(budget + buffer - 1 + largest_step, total), 1,
                                         registry::page_entries);
    const inputs::Producer producer = registry::open_inputs(given, {shape, hidden});
    require(producer.needs().key_layout != inputs::RopeLayout::half, "policy ", given.policy,
            "'s gate was trained on keys in RoPE's rotate-half layout; llama.cpp's keys pair components adjacently");
    require(!producer.needs().keys_pre_rope && !producer.needs().per_token(), "policy ", given.policy,
            " reads keys before RoPE or hidden-state bands, which this program does not take from llama.cpp's graph");
    require(registry::over_engine_storage(given.policy), "policy ", given.policy,
            " cannot run over llama.cpp's own K/V (SPEC §9); policies that can: ", registry::over_engine_storage_policies());
    const auto open = [&] { return registry::open_cache<engine_owned>(given, shape, pages); };
    std::unique_ptr<AnyCache> cache = open();
    // llama.cpp keeps a sequence's positions consecutive with the newest it stores (a batch must
    // start at its last position + 1), so the newest token must stay: a protected window w >= 1
    // (SPEC §8). Where the policy's own window resolves to 0, w = 1 unless given.
    std::int64_t window = cache->protected_window();
    if (window == 0) {
      require(!given.given.contains("window"), "--window 0: llama.cpp needs the newest position kept (a batch ",
              "starts at the last stored position + 1); give --window w >= 1");
      given.set("window", "1");
      cache.reset();  // its pool goes before the next one is taken
      cache = open();
      window = 1;
    }
    policy_mib = static_cast<double>(cache->pool_bytes()) / (1024.0 * 1024.0);
    policy_holds = cache->reads_stored_kv() ? "metadata only, reading llama.cpp's K cells" : "metadata only, over llama.cpp's K/V";
    // what the callback takes: the K cells' writes always (the keys are read from the cells), and
    // the normed inputs, values and queries only where the policy reads them
    cap.key_cells.resize(static_cast<std::size_t>(layers));
    cap.wanted[Captured::normed] = producer.needs().per_layer();
    cap.wanted[Captured::values] = producer.needs().values;
    cap.wanted[Captured::queries] = cache->observes_attention();
    cap.wanted[Captured::keys] = a.check_memory;
    LlamaKeys llama_keys{cap, shape};
    cache->add_sequence(0, std::min(prefill, N));
    Evicting policy{*cache, producer, cap, m, shape, hidden, a.check_memory, llama_keys};
    go(&policy);
    held_max = policy.held_max;
    policy_seconds = policy.policy_seconds;
    evicted = policy.evicted_positions;
    steps_checked = policy.steps_checked;
    survivors = apps::head_digests(*cache, 0);
    // a llama.cpp cell holds every head's K/V: each (layer, kv head) holds what its memory lists
    if (!a.survivors.empty()) {
      const std::vector<std::int32_t> held = memory_positions(m.ctx, policy.state);
      apps::write_position_lines(shape, [&](int, int) { return held; }, a.survivors);
    }
    mode_line = given.policy + " (token level, SPEC §8): M = " + std::to_string(budget) + " tokens, B = " +
                std::to_string(buffer) + ", S = " + given.value("sinks") + ", w = " + std::to_string(window);
  }
  const auto t_end = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(t_end - t0).count();
  const double context_s = std::chrono::duration<double>(t_context - t0).count();
  const double decode_s = std::chrono::duration<double>(t_end - t_context).count();

  std::printf("model: %s: L = %d, Hkv = %d, Hq = %d, d = %d, vocab %d\n", a.model.c_str(), layers, kv_heads, q_heads, d,
              n_vocab);
  std::printf("policy: %s\n", mode_line.c_str());
  std::printf("llama.cpp context: %u cells (%.2f MiB of F16 K/V); positions held at most %lld, %lld evicted%s\n",
              llama_n_ctx(m.ctx), kv_mib, static_cast<long long>(with_policy ? held_max : total),
              static_cast<long long>(evicted), a.check_memory ? " (counted in llama.cpp's memory)" : "");
  if (with_policy) {
    std::printf("policy state (%s): %.2f MiB, %.1f%% of llama.cpp's K/V\n", policy_holds.c_str(), policy_mib,
                100.0 * policy_mib / kv_mib);
    std::printf("policy time: %.3f s of %.3f s (inputs, gate, scores, selection, removal)\n", policy_seconds,
                std::chrono::duration<double>(t_end - t0).count());
  }
  if (a.check_memory)
    std::printf("llama.cpp memory: after each of %lld steps, exactly the positions the policy keeps\n",
                static_cast<long long>(steps_checked));
  std::printf("timing: %lld tokens in %.3f s, %.1f tokens/s; context %lld tokens, %.1f tokens/s; decode %lld "
              "tokens, %.1f tokens/s\n",
              static_cast<long long>(N + static_cast<std::int64_t>(generated.size())), seconds,
              static_cast<double>(N + static_cast<std::int64_t>(generated.size())) / seconds, static_cast<long long>(N),
              static_cast<double>(N) / context_s, static_cast<long long>(generated.size()),
              generated.empty() ? 0.0 : static_cast<double>(generated.size()) / decode_s);
  if (!generated.empty()) {
    std::string text;
    for (const llama_token t : generated) {
      char piece[256];
      const int n = llama_token_to_piece(vocab, t, piece, sizeof piece, 0, false);
      if (n > 0) text.append(piece, static_cast<std::size_t>(n));
    }
    std::printf("generated: %s\n", text.c_str());
  }
  std::printf("logits %016llx\n", static_cast<unsigned long long>(digest.h));
  // the same digest as kvpolicy-lm's: the same positions in every (layer, kv head)
  if (with_policy) std::printf("survivors %s\n", apps::digest_text(survivors).c_str());
  if (a.prompts.empty()) {
    require(scored > 0, "no position to score: --score-from ", a.score_from, " is past the ", N, " tokens");
    std::printf("ppl %.6f\n", std::exp(nll_sum / static_cast<double>(scored)));
  }
  llama_backend_free();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
