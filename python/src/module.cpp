// kvpolicy._core: the policy registry and the Cache (cpu_backend) for Python. Arrays come in as
// NumPy arrays or CPU torch tensors (DLPack), float32 and C-contiguous, and are read in place; the
// library's checks name every bad value, and its errors arrive as kvpolicy.Error (a ValueError)
// with the library's message. Steps release the GIL: threads may step different sequences of one
// Cache at once (docs/concurrency.md), as in C++.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "make_cache.hpp"
#include "kvpolicy/epikv.hpp"
#include "kvpolicy/inputs/producer.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvpolicy::python {
namespace {

using Input = nb::ndarray<nb::ro>;  // any dtype, device and layout: checked here, with the value named
using Output = nb::ndarray<>;

/// "(2, 2, 1, 15)": an array's shape as the messages give it.
template <class A>
std::string shape_text(const A& a) {
  std::ostringstream s;
  s << "(";
  for (std::size_t i = 0; i < a.ndim(); ++i) s << (i ? ", " : "") << a.shape(i);
  return s.str() + ")";
}

std::string dtype_name(nb::dlpack::dtype t) {
  const auto code = static_cast<nb::dlpack::dtype_code>(t.code);
  const char* kind = code == nb::dlpack::dtype_code::Float  ? "float"
                     : code == nb::dlpack::dtype_code::Int  ? "int"
                     : code == nb::dlpack::dtype_code::UInt ? "uint"
                     : code == nb::dlpack::dtype_code::Bfloat ? "bfloat"
                     : code == nb::dlpack::dtype_code::Bool ? "bool"
                                                            : "other";
  return std::string(kind) + std::to_string(t.bits);
}

/// A float32, C-contiguous CPU array of `rank` dimensions whose extents equal `want` where want is
/// >= 0 (-1: any); `dims` names them for the message ("layers, kv_heads, T, head_dim").
template <class A>
void check_array(const A& a, const char* name, std::size_t rank, std::initializer_list<std::int64_t> want, const char* dims) {
  require(a.device_type() == nb::device::cpu::value, name, ": an array on device type ", a.device_type(),
          "; this Cache keeps its entries on the CPU (NumPy arrays or CPU torch tensors)");
  require(a.dtype() == nb::dtype<float>(), name, ": dtype ", dtype_name(a.dtype()),
          "; the Cache takes float32 (its storage type is the Cache's `storage`)");
  require(a.ndim() == rank, name, ": ", a.ndim(), " dimensions; expected ", rank, " [", dims, "]");
  std::int64_t stride = 1;
  for (std::size_t i = rank; i-- > 0;) {
    require(a.shape(i) <= 1 || a.stride(i) == stride, name, ": not C-contiguous (strides in elements ", [&] {
      std::ostringstream s;
      for (std::size_t j = 0; j < rank; ++j) s << (j ? ", " : "") << a.stride(j);
      return s.str();
    }(), "); pass a contiguous array (numpy.ascontiguousarray, tensor.contiguous())");
    stride *= static_cast<std::int64_t>(a.shape(i));
  }
  std::size_t i = 0;
  for (const std::int64_t w : want) {
    require(w < 0 || static_cast<std::int64_t>(a.shape(i)) == w, name, ": shape ", shape_text(a), "; expected [", dims, "] with ", [&] {
      std::ostringstream s;
      std::size_t k = 0;
      for (const std::int64_t x : want) s << (k++ ? ", " : "") << (x < 0 ? std::string("*") : std::to_string(x));
      return s.str();
    }());
    ++i;
  }
}

template <std::size_t N>
View<const float, N> view_of(const Input& a) {
  std::array<std::int64_t, N> shape{};
  for (std::size_t i = 0; i < N; ++i) shape[i] = static_cast<std::int64_t>(a.shape(i));
  return View<const float, N>(static_cast<const float*>(a.data()), shape);
}
template <std::size_t N>
View<float, N> view_of(Output& a) {
  std::array<std::int64_t, N> shape{};
  for (std::size_t i = 0; i < N; ++i) shape[i] = static_cast<std::int64_t>(a.shape(i));
  return View<float, N>(static_cast<float*>(a.data()), shape);
}

/// A NumPy array that owns `v`.
template <class T>
nb::ndarray<nb::numpy, T> numpy_of(std::vector<T>&& v, std::initializer_list<std::size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.begin(), owner);
}

/// What a step or commit did, and what its attention wrote.
struct Report {
  bool triggered = false;
  std::int64_t evicted = 0;
  nb::object evicted_entries = nb::none();  // [n, 3] int32 (layer, head, position), when asked for
  nb::object out = nb::none();              // the attention output, when the step attended

  static Report of(const EvictionReport& r, const std::vector<EvictedEntry>* gone) {
    Report p{r.triggered, r.evicted};
    if (gone != nullptr) {
      std::vector<std::int32_t> rows;
      rows.reserve(gone->size() * 3);
      for (const EvictedEntry& e : *gone) rows.insert(rows.end(), {e.layer, e.head, e.position});
      p.evicted_entries = nb::cast(numpy_of(std::move(rows), {gone->size(), 3}));
    }
    return p;
  }
};

/// The producer of a policy's inputs (kvpolicy/inputs/producer.hpp) and the model it scores for.
struct PyProducer {
  inputs::Producer producer;
  inputs::ModelShape model;
};

/// Python's keyword options as the registry reads them (underscores for the command line's dashes).
registry::Selection selection_of(std::string policy, const nb::kwargs& options) {
  registry::Selection sel;
  sel.policy = std::move(policy);
  for (auto [key, value] : options) {
    std::string name = nb::cast<std::string>(nb::str(key));
    for (char& c : name)
      if (c == '_') c = '-';
    sel.given[name] = nb::cast<std::string>(nb::str(value));  // the registry parses and checks it
  }
  return sel;
}

/// What a producer reads, as Python sees it.
nb::dict needs_dict(const inputs::Needs& n) {
  nb::dict d;
  d["normed_input"] = n.normed_input;
  d["keys_pre_rope"] = n.keys_pre_rope;
  d["keys"] = n.keys;
  d["values"] = n.values;
  d["bands"] = n.bands ? nb::object(nb::make_tuple((*n.bands)[0], (*n.bands)[1])) : nb::none();
  d["key_layout"] = n.key_layout == inputs::RopeLayout::half ? "half" : n.key_layout == inputs::RopeLayout::adjacent ? "adjacent" : "any";
  if (n.reconstruction) {  // the probe the engine runs after the prompt (SPEC §10)
    nb::dict r;
    r["instruction"] = std::string(n.reconstruction->instruction);
    r["prefix"] = n.reconstruction->prefix;
    d["reconstruction"] = r;
  } else {
    d["reconstruction"] = nb::none();
  }
  return d;
}

/// The policy's input source (registry::input_source) beside its Cache, for the checks that name it.
class PyCache {
 public:
  PyCache(std::string policy, const CacheShape& shape, std::int64_t max_tokens, std::int64_t max_sequences,
          std::int64_t pages, const std::string& storage, const nb::kwargs& options) {
    selection_ = selection_of(std::move(policy), options);
    require(max_tokens >= 1, "Cache: max_tokens = ", max_tokens, " must be >= 1");
    require(max_sequences >= 1, "Cache: max_sequences = ", max_sequences, " must be >= 1");
    shape.validate();
    const KvStorage s = storage == "float32"    ? KvStorage::float32
                        : storage == "float16"  ? KvStorage::float16
                        : storage == "bfloat16" ? KvStorage::bfloat16
                                                : (fail("Cache: storage '", storage, "' must be float32, float16 or bfloat16"),
                                                   KvStorage::float32);
    // every token in every head by default: the policy, not the pool, bounds what stays
    if (pages <= 0) pages = pages_for(shape, max_tokens + 16, max_sequences, 16);
    source_ = registry::input_source(selection_.policy);
    cache_ = make_cache(selection_, shape, pages, s);
    storage_ = storage;
  }

  AnyCache& c() { return *cache_; }
  const AnyCache& c() const { return *cache_; }
  const registry::Selection& selection() const { return selection_; }
  const std::string& storage() const { return storage_; }

  /// scores [.., T] for append/step: the given array, or zeros where the policy computes none (it
  /// reads nothing, or only a probe after the prompt: KVzip, SPEC §10).
  bool needs_scores() const {
    return source_.scores != inputs::Scores::none && !cache_->takes_step_scores();
  }
  void require_scores(bool given, const char* where) const {
    require(given || !needs_scores(), where, ": policy ", selection_.policy, " ranks by scores the model computes (",
            source_.name, "): pass scores=");
  }

 private:
  registry::Selection selection_;
  std::unique_ptr<AnyCache> cache_;
  std::string storage_;
  registry::InputSource source_;
};

/// One sequence's step, converted and checked while the GIL is held.
struct StepArrays {
  SequenceStep step;
  std::vector<float> zeros;  // the scores a policy without inputs reads
  std::optional<Output> out;
};

StepArrays step_arrays(PyCache& self, std::int64_t seq, const Input& keys, const Input& values,
                       const std::optional<Input>& scores, const std::optional<Input>& queries,
                       const std::optional<Output>& out, const std::optional<Input>& gates) {
  const CacheShape& s = self.c().shape();
  check_array(keys, "keys", 4, {s.layers, s.kv_heads, -1, s.head_dim}, "layers, kv_heads, T, head_dim");
  const auto T = static_cast<std::int64_t>(keys.shape(2));
  check_array(values, "values", 4, {s.layers, s.kv_heads, T, s.head_dim}, "layers, kv_heads, T, head_dim");
  StepArrays a;
  a.step.seq = seq;
  a.step.keys = view_of<4>(keys);
  a.step.values = view_of<4>(values);
  self.require_scores(scores.has_value(), "Cache.step");
  if (scores) {
    check_array(*scores, "scores", 3, {s.layers, s.kv_heads, T}, "layers, kv_heads, T");
    a.step.log_beta = view_of<3>(*scores);
  } else {
    a.zeros.assign(static_cast<std::size_t>(s.heads_total() * T), 0.0f);
    a.step.log_beta = View<const float, 3>(a.zeros.data(), {s.layers, s.kv_heads, T});
  }
  if (gates) {
    check_array(*gates, "gates", 3, {s.layers, s.kv_heads, T}, "layers, kv_heads, T");
    a.step.gate = view_of<3>(*gates);
  }
  if (queries) {
    check_array(*queries, "queries", 4, {s.layers, s.q_heads, T, s.head_dim}, "layers, q_heads, T, head_dim");
    a.step.queries = view_of<4>(*queries);
    if (out) {
      check_array(*out, "out", 4, {s.layers, s.q_heads, T, s.head_dim}, "layers, q_heads, T, head_dim");
      a.out = *out;
    } else {
      const std::size_t n[4] = {static_cast<std::size_t>(s.layers), static_cast<std::size_t>(s.q_heads),
                                static_cast<std::size_t>(T), static_cast<std::size_t>(s.head_dim)};
      a.out = nb::cast<Output>(nb::module_::import_("numpy").attr("empty")(nb::make_tuple(n[0], n[1], n[2], n[3]), "float32"));
    }
    a.step.out = view_of<4>(*a.out);
  } else {
    require(!out, "Cache.step: out= without queries=: the step attends only when it is given queries");
  }
  return a;
}

nb::dict head_entries(const AnyCache& c, std::int64_t seq, int layer, int head) {
  const HeadContents h = c.head_contents(seq, layer, head);
  const std::size_t n = h.meta.size(), d = static_cast<std::size_t>(c.shape().head_dim);
  std::vector<std::int32_t> position(n);
  std::vector<float> write_score(n), key_norm(n), attention_mass(n), gate(n);
  for (std::size_t i = 0; i < n; ++i) {
    position[i] = h.meta[i].position;
    write_score[i] = h.meta[i].write_score;
    key_norm[i] = h.meta[i].key_norm;
    attention_mass[i] = h.meta[i].attention_mass;
    gate[i] = h.meta[i].gate;
  }
  nb::dict out;
  out["position"] = numpy_of(std::move(position), {n});
  out["write_score"] = numpy_of(std::move(write_score), {n});
  out["key_norm"] = numpy_of(std::move(key_norm), {n});
  out["attention_mass"] = numpy_of(std::move(attention_mass), {n});
  out["gate"] = numpy_of(std::move(gate), {n});
  out["keys"] = numpy_of(std::vector<float>(h.keys), {n, d});
  out["values"] = numpy_of(std::vector<float>(h.values), {n, d});
  return out;
}

nb::dict policy_info() {
  nb::dict all;
  registry::for_each([&]<registry::Policy P>() {
    nb::dict options;
    for (const registry::Option& o : P::options) {
      nb::dict opt;
      const char* kind = o.kind == registry::Kind::integer ? "integer"
                         : o.kind == registry::Kind::real  ? "real"
                         : o.kind == registry::Kind::choice ? "choice"
                                                            : "path";
      opt["kind"] = kind;
      opt["help"] = std::string(o.help);
      switch (o.kind) {
        case registry::Kind::integer: opt["default"] = static_cast<std::int64_t>(o.fallback); break;
        case registry::Kind::real: opt["default"] = o.fallback; break;
        case registry::Kind::choice: opt["default"] = o.default_text(); break;
        case registry::Kind::path: opt["default"] = nb::none(); break;
      }
      nb::list choices;
      for (const auto c : o.choices)
        if (!c.empty()) choices.append(std::string(c));
      if (o.kind == registry::Kind::choice) opt["choices"] = choices;
      std::string key(o.name);
      for (char& c : key)
        if (c == '-') c = '_';
      options[key.c_str()] = opt;
    }
    nb::dict p;
    p["help"] = std::string(P::help);
    using I = typename P::inputs;
    p["inputs"] = std::string(I::name);
    p["scores"] = std::string(inputs::name_of(I::scores));
    p["gated"] = inputs::gated_v<I>;
    p["probes"] = inputs::probes_v<I>;
    p["needs_prompt_length"] = kvpolicy::registry::needs_prompt_length_v<P>;
    p["options"] = options;
    all[std::string(P::name).c_str()] = p;
  });
  return all;
}

}  // namespace

std::unique_ptr<AnyCache> make_cache(const registry::Selection& selection, const CacheShape& shape, std::int64_t pages,
                                     KvStorage storage) {
  switch (storage) {
    case KvStorage::float16: return detail::make_float16(selection, shape, pages);
    case KvStorage::bfloat16: return detail::make_bfloat16(selection, shape, pages);
    case KvStorage::engine_owned: fail("Cache: storage engine-owned is not offered to Python (it has no attend())");
    case KvStorage::float32: break;
  }
  return detail::make_float32(selection, shape, pages);
}

}  // namespace kvpolicy::python

NB_MODULE(_core, m) {
  using namespace kvpolicy;
  using namespace kvpolicy::python;
  m.doc() = "kvpolicy: KV-cache policies (TRIM-KV, DBTrimKV, WG-KV, EpiKV and the baselines) as a Cache";
  m.attr("__version__") = KVPOLICY_VERSION;
  nb::exception<Error>(m, "Error", PyExc_ValueError);

  m.def("policies", &policy_info,
        "Every registered policy: its help, its input source (inputs: its name; scores: what it writes per entry, "
        "log_beta, gate, score or none; gated: it reads the file gate= names; probes: the engine runs a probe after "
        "the prompt), whether it compresses a declared prompt, and its options with defaults.");
  m.def(
      "example_gate",
      [](const std::string& policy, const std::string& path, int layers, int kv_heads, int head_dim, int hidden, float level) {
        const CacheShape shape{layers, kv_heads, kv_heads, head_dim};
        shape.validate();
        registry::example_gate(policy, path, {shape, hidden}, level);
      },
      nb::arg("policy"), nb::arg("path"), nb::arg("layers"), nb::arg("kv_heads"), nb::arg("head_dim"), nb::arg("hidden"),
      nb::arg("level") = 0.0f,
      "Writes to path an example of the file a gated policy's gate= takes, for a model of these shapes: small random "
      "weights, every readout bias `level` (large: every entry kept; very negative: every entry the policy may drop "
      "dropped). What the tests run every gated policy with.");

  nb::class_<Report>(m, "Report", "What a step or commit did.")
      .def_ro("triggered", &Report::triggered, "whether the evictor's trigger fired")
      .def_ro("evicted", &Report::evicted, "entries that left the cache")
      .def_ro("evicted_entries", &Report::evicted_entries,
              "[n, 3] int32 (layer, head, position) of the evicted entries, when asked for (return_evicted=True)")
      .def_ro("out", &Report::out, "the attention output [layers, q_heads, T, head_dim], when the step attended")
      .def("__repr__", [](const Report& r) {
        return "Report(triggered=" + std::string(r.triggered ? "True" : "False") + ", evicted=" + std::to_string(r.evicted) + ")";
      });

  nb::class_<PyCache>(m, "Cache",
                      "A KV cache that keeps what its policy keeps, per (layer, kv head), in a paged pool on the CPU.")
      .def(
          "__init__",
          [](PyCache* self, std::string policy, int layers, int kv_heads, int q_heads, int head_dim,
             std::int64_t max_tokens, std::int64_t max_sequences, std::int64_t pages, std::string storage,
             nb::kwargs options) {
            new (self) PyCache(std::move(policy), CacheShape{layers, kv_heads, q_heads, head_dim}, max_tokens,
                               max_sequences, pages, storage, options);
          },
          "policy"_a, nb::kw_only(), "layers"_a, "kv_heads"_a, "q_heads"_a, "head_dim"_a, "max_tokens"_a,
          "max_sequences"_a = 1, "pages"_a = 0, "storage"_a = "float32", "options"_a,
          "policy: a registered name (kvpolicy.policies()); options: the policy's, as keywords (budget=128, "
          "buffer=16, pool_kernel=5: '_' for the registry's '-'). The pool holds max_tokens entries in every head "
          "of max_sequences sequences unless pages= sizes it (pages of 16 entries).")
      .def_prop_ro("policy", [](const PyCache& c) { return c.selection().policy; })
      .def_prop_ro("options", [](const PyCache& c) {
        nb::dict d;
        for (const auto& [k, v] : c.selection().given) d[k.c_str()] = v;
        return d;
      }, "the options given (text, as the registry read them); the rest are the policy's defaults")
      .def_prop_ro("storage", &PyCache::storage)
      .def_prop_ro("shape", [](const PyCache& c) {
        const CacheShape& s = c.c().shape();
        return nb::make_tuple(s.layers, s.kv_heads, s.q_heads, s.head_dim);
      }, "(layers, kv_heads, q_heads, head_dim)")
      .def_prop_ro("pages_free", [](const PyCache& c) { return c.c().pages_free(); })
      .def_prop_ro("pages_total", [](const PyCache& c) { return c.c().pages_total(); })
      .def("add_sequence", [](PyCache& c, std::int64_t seq, std::int64_t prompt) { c.c().add_sequence(seq, prompt); },
           "seq"_a, "prompt_tokens"_a = -1,
           "prompt_tokens: the prompt's length, for the policies that compress or protect it (-1: unknown)")
      .def("remove_sequence", [](PyCache& c, std::int64_t seq) { c.c().remove_sequence(seq); }, "seq"_a)
      .def("__contains__", [](const PyCache& c, std::int64_t seq) { return c.c().has_sequence(seq); })
      .def("tokens", [](const PyCache& c, std::int64_t seq) { return c.c().tokens(seq); }, "seq"_a,
           "tokens of the sequence its committed steps processed")
      .def("prompt_tokens", [](const PyCache& c, std::int64_t seq) { return c.c().prompt_tokens(seq); }, "seq"_a)
      .def("length", [](const PyCache& c, std::int64_t seq, int l, int h) { return c.c().length(seq, l, h); }, "seq"_a,
           "layer"_a, "head"_a, "entries one (layer, kv head) holds")
      .def("total_length", [](const PyCache& c, std::int64_t seq) { return c.c().total_length(seq); }, "seq"_a,
           "entries the sequence holds over every layer and head: the memory it holds, in entries")
      .def("entries", [](const PyCache& c, std::int64_t seq, int l, int h) { return head_entries(c.c(), seq, l, h); },
           "seq"_a, "layer"_a, "head"_a,
           "what one head holds, in storage order: position, write_score, key_norm, attention_mass, gate [n]; "
           "keys, values [n, head_dim] (copies)")
      .def(
          "append",
          [](PyCache& c, std::int64_t seq, int layer, const Input& keys, const Input& values,
             const std::optional<Input>& scores, const std::optional<Input>& gates) {
            const CacheShape& s = c.c().shape();
            check_array(keys, "keys", 3, {s.kv_heads, -1, s.head_dim}, "kv_heads, T, head_dim");
            const auto T = static_cast<std::int64_t>(keys.shape(1));
            check_array(values, "values", 3, {s.kv_heads, T, s.head_dim}, "kv_heads, T, head_dim");
            c.require_scores(scores.has_value(), "Cache.append");
            std::vector<float> zeros;
            View<const float, 2> sc;
            if (scores) {
              check_array(*scores, "scores", 2, {s.kv_heads, T}, "kv_heads, T");
              sc = view_of<2>(*scores);
            } else {
              zeros.assign(static_cast<std::size_t>(s.kv_heads * T), 0.0f);
              sc = View<const float, 2>(zeros.data(), {s.kv_heads, T});
            }
            View<const float, 2> g;
            if (gates) {
              check_array(*gates, "gates", 2, {s.kv_heads, T}, "kv_heads, T");
              g = view_of<2>(*gates);
            }
            nb::gil_scoped_release unlocked;
            c.c().append(seq, layer, view_of<3>(keys), view_of<3>(values), sc, g);
          },
          "seq"_a, "layer"_a, "keys"_a, "values"_a, "scores"_a = nb::none(), "gates"_a = nb::none(),
          "Opens or continues a step: one layer's keys/values [kv_heads, T, head_dim] (after RoPE), scores "
          "[kv_heads, T] (log beta, g or the policy's score: what policies()[name]['inputs'] names), gates [kv_heads, T] "
          "(WG-KV's write gate, for its admission)")
      .def(
          "set_step_scores",
          [](PyCache& c, std::int64_t seq, int layer, const Input& scores) {
            const CacheShape& s = c.c().shape();
            check_array(scores, "scores", 2, {s.kv_heads, -1}, "kv_heads, T");
            c.c().set_step_scores(seq, layer, view_of<2>(scores));
          },
          "seq"_a, "layer"_a, "scores"_a, "EpiKV's frozen scores of the open step's entries (SPEC §4), before commit")
      .def(
          "attend",
          [](PyCache& c, std::int64_t seq, int layer, const Input& queries, std::optional<Output> out) {
            const CacheShape& s = c.c().shape();
            check_array(queries, "queries", 3, {s.q_heads, -1, s.head_dim}, "q_heads, T, head_dim");
            const auto T = static_cast<std::size_t>(queries.shape(1));
            if (out)
              check_array(*out, "out", 3, {s.q_heads, static_cast<std::int64_t>(T), s.head_dim}, "q_heads, T, head_dim");
            else
              out = nb::cast<Output>(nb::module_::import_("numpy").attr("empty")(
                  nb::make_tuple(s.q_heads, T, s.head_dim), "float32"));
            {
              nb::gil_scoped_release unlocked;
              c.c().attend(seq, layer, view_of<3>(queries), view_of<3>(*out));
            }
            return *out;
          },
          "seq"_a, "layer"_a, "queries"_a, "out"_a = nb::none(),
          "queries [q_heads, T, head_dim] of the open step's tokens -> their attention over what the head holds "
          "(causal within the step), into out or a new array")
      .def(
          "commit",
          [](PyCache& c, std::int64_t seq, bool return_evicted) {
            std::vector<EvictedEntry> gone;
            EvictionReport r;
            {
              nb::gil_scoped_release unlocked;
              r = c.c().commit(seq, return_evicted ? &gone : nullptr);
            }
            return Report::of(r, return_evicted ? &gone : nullptr);
          },
          "seq"_a, "return_evicted"_a = false, "Closes the step: the trigger, and the eviction when it fires")
      .def("abort_step", [](PyCache& c, std::int64_t seq) { c.c().abort_step(seq); }, "seq"_a,
           "Takes back the open step: as if it had never started")
      .def("open_probe", [](PyCache& c, std::int64_t seq) { c.c().open_probe(seq); }, "seq"_a,
           "Makes the next step of seq a probe (SPEC §10): its tokens are attended and scored with, then leave at "
           "its commit, and the sequence stays at its length (KVzip's repetition of the prompt)")
      .def(
          "step",
          [](PyCache& c, std::int64_t seq, const Input& keys, const Input& values, const std::optional<Input>& scores,
             const std::optional<Input>& queries, const std::optional<Output>& out, const std::optional<Input>& gates,
             bool return_evicted) {
            StepArrays a = step_arrays(c, seq, keys, values, scores, queries, out, gates);
            std::vector<EvictedEntry> gone;
            EvictionReport r;
            {
              nb::gil_scoped_release unlocked;
              r = c.c().step(a.step, return_evicted ? &gone : nullptr);
            }
            Report p = Report::of(r, return_evicted ? &gone : nullptr);
            if (a.out) p.out = nb::cast(*a.out);
            return p;
          },
          "seq"_a, "keys"_a, "values"_a, "scores"_a = nb::none(), "queries"_a = nb::none(), "out"_a = nb::none(),
          "gates"_a = nb::none(), "return_evicted"_a = false,
          "One sequence's whole step: keys/values [layers, kv_heads, T, head_dim], scores/gates [layers, kv_heads, T], "
          "queries [layers, q_heads, T, head_dim] to attend (the output in Report.out, or in out=). Validated whole "
          "first; a step that fails leaves the cache as it was.")
      .def(
          "step_batch",
          [](PyCache& c, const nb::list& steps) {
            std::vector<StepArrays> arrays;
            std::vector<SequenceStep> batch;
            for (nb::handle item : steps) {
              const nb::dict d = nb::cast<nb::dict>(item);
              const auto opt_in = [&](const char* k) {
                return d.contains(k) && !d[k].is_none() ? std::optional<Input>(nb::cast<Input>(d[k])) : std::nullopt;
              };
              const auto opt_out = [&](const char* k) {
                return d.contains(k) && !d[k].is_none() ? std::optional<Output>(nb::cast<Output>(d[k])) : std::nullopt;
              };
              arrays.push_back(step_arrays(c, nb::cast<std::int64_t>(d["seq"]), nb::cast<Input>(d["keys"]),
                                           nb::cast<Input>(d["values"]), opt_in("scores"), opt_in("queries"),
                                           opt_out("out"), opt_in("gates")));
            }
            for (const StepArrays& a : arrays) batch.push_back(a.step);
            std::vector<EvictionReport> r;
            {
              nb::gil_scoped_release unlocked;
              r = c.c().step_batch(batch);
            }
            nb::list reports;
            for (std::size_t i = 0; i < r.size(); ++i) {
              Report p = Report::of(r[i], nullptr);
              if (arrays[i].out) p.out = nb::cast(*arrays[i].out);
              reports.append(p);
            }
            return reports;
          },
          "steps"_a,
          "Several sequences' steps at once: a list of dicts with step()'s arguments (seq, keys, values, and "
          "optionally scores, queries, out, gates). The whole batch is validated first; a failure takes every step back.");

  nb::class_<PyProducer>(m, "Producer",
                         "What a policy reads from the forward pass, produced by the library for every sequence of a "
                         "model: log beta from a retention gate (SPEC §1, §2), g from a write gate (SPEC §3), a K/V "
                         "statistic or a hidden-state signal (SPEC §4). needs says which tensors to pass.")
      .def(
          "__init__",
          [](PyProducer* self, const std::string& policy, int layers, int hidden, int kv_heads, int q_heads, int head_dim,
             const nb::kwargs& options) {
            const registry::Selection sel = selection_of(policy, options);
            const inputs::ModelShape model{{layers, kv_heads, q_heads, head_dim}, hidden};
            new (self) PyProducer{registry::open_inputs(sel, model), model};
          },
          "policy"_a, nb::kw_only(), "layers"_a, "hidden"_a, "kv_heads"_a, "q_heads"_a, "head_dim"_a, "options"_a,
          "the policy and its options (as Cache takes them: gate=, band_a=, ...), and the model's shape")
      .def_static(
          "needs_of",
          [](const std::string& policy, const nb::kwargs& options) {
            return needs_dict(registry::input_needs(selection_of(policy, options)));
          },
          "policy"_a, "options"_a, "what the policy reads, from its options alone (before a model is known)")
      .def_prop_ro("needs", [](const PyProducer& p) { return needs_dict(p.producer.needs()); },
                   "what it reads: normed_input, keys_pre_rope, keys, values (bools), bands (a pair of hidden-state "
                   "indices, or None) and key_layout (the RoPE layout its keys are expected in: adjacent or half)")
      .def(
          "layer",
          [](const PyProducer& p, std::int64_t seq, int layer, std::optional<Input> normed_input,
             std::optional<Input> keys_pre_rope, std::optional<Input> keys, std::optional<Input> values) {
            const CacheShape& s = p.model.cache;
            std::int64_t T = -1;
            for (const auto* a : {&keys, &values, &keys_pre_rope})
              if (*a && (*a)->ndim() == 3) T = static_cast<std::int64_t>((*a)->shape(1));
            if (normed_input && normed_input->ndim() == 2) T = static_cast<std::int64_t>(normed_input->shape(0));
            inputs::LayerActivations a;
            if (normed_input) {
              check_array(*normed_input, "normed_input", 2, {T, p.model.hidden}, "T, hidden");
              a.normed_input = view_of<2>(*normed_input);
            }
            const auto kv = [&](const std::optional<Input>& x, const char* name, View<const float, 3>& to) {
              if (!x) return;
              check_array(*x, name, 3, {s.kv_heads, T, s.head_dim}, "kv_heads, T, head_dim");
              to = view_of<3>(*x);
            };
            kv(keys_pre_rope, "keys_pre_rope", a.keys_pre_rope);
            kv(keys, "keys", a.keys);
            kv(values, "values", a.values);
            require(T >= 1, "Producer.layer: give the tensors needs lists (T tokens each)");
            std::vector<float> out(static_cast<std::size_t>(s.kv_heads * T));
            p.producer.layer(seq, layer, a, View<float, 2>(out.data(), {s.kv_heads, T}));
            return numpy_of(std::move(out), {static_cast<std::size_t>(s.kv_heads), static_cast<std::size_t>(T)});
          },
          "seq"_a, "layer"_a, nb::kw_only(), "normed_input"_a = nb::none(), "keys_pre_rope"_a = nb::none(),
          "keys"_a = nb::none(), "values"_a = nb::none(),
          "one layer's new tokens of sequence seq (layers in order): normed_input [T, hidden], keys_pre_rope, keys, "
          "values [kv_heads, T, head_dim], as needs lists -> their scores [kv_heads, T]")
      .def(
          "tokens",
          [](const PyProducer& p, std::int64_t seq, const Input& h_a, const Input& h_b) {
            check_array(h_a, "h_a", 2, {-1, p.model.hidden}, "T, hidden");
            const auto T = static_cast<std::int64_t>(h_a.shape(0));
            check_array(h_b, "h_b", 2, {T, p.model.hidden}, "T, hidden");
            std::vector<float> out(static_cast<std::size_t>(T));
            p.producer.tokens(seq, view_of<2>(h_a), view_of<2>(h_b), std::span<float>(out));
            return numpy_of(std::move(out), {static_cast<std::size_t>(T)});
          },
          "seq"_a, "h_a"_a, "h_b"_a,
          "a step's hidden states of sequence seq at bands A and B [T, hidden] -> each token's score [T], the same in "
          "every layer and kv head")
      .def("drop", [](const PyProducer& p, std::int64_t seq) { p.producer.drop(seq); }, "seq"_a,
           "forgets sequence seq's rolling state");
}
