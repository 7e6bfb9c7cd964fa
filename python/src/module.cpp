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

#include "any_cache.hpp"
#include "kvpolicy/gate/load.hpp"
#include "kvpolicy/epikv.hpp"
#include "kvpolicy/gate/write_gate.hpp"

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

/// A retention gate with the shape its output takes.
struct RetentionGateFile {
  gate::LayerGate forward;
  int hidden = 0;
  int kv_heads = 0;
};

/// The K/V statistic a policy of the kv-statistics family ranks by (SPEC §4), one tracker per sequence.
struct KVStatistic {
  std::unique_ptr<kvstats::Tracker> tracker;
  CacheShape shape;
};

/// EpiKV's and HS-var's hidden-state signal (SPEC §4), one per sequence.
struct HiddenStateSignal {
  std::unique_ptr<epiphany::Signal> signal;
  int hidden = 0;
};

/// The policy's needs (registry::Inputs) beside its Cache, for the checks that name them.
class PyCache {
 public:
  PyCache(std::string policy, const CacheShape& shape, std::int64_t max_tokens, std::int64_t max_sequences,
          std::int64_t pages, const std::string& storage, const nb::kwargs& options) {
    selection_.policy = std::move(policy);
    for (auto [key, value] : options) {
      std::string name = nb::cast<std::string>(nb::str(key));
      for (char& c : name)
        if (c == '_') c = '-';
      selection_.given[name] = nb::cast<std::string>(nb::str(value));  // the registry parses and checks it
    }
    require(max_tokens >= 1, "Cache: max_tokens = ", max_tokens, " must be >= 1");
    require(max_sequences >= 1, "Cache: max_sequences = ", max_sequences, " must be >= 1");
    shape.validate();
    const Storage s = storage == "float32"    ? Storage::float32
                      : storage == "float16"  ? Storage::float16
                      : storage == "bfloat16" ? Storage::bfloat16
                                              : (fail("Cache: storage '", storage, "' must be float32, float16 or bfloat16"),
                                                 Storage::float32);
    // every token in every head by default: the policy, not the pool, bounds what stays
    if (pages <= 0) pages = pages_for(shape, max_tokens + 16, max_sequences, 16);
    registry::visit(selection_.policy, [&]<registry::Policy P>() {
      inputs_ = P::inputs;
    });
    cache_ = make_cache(selection_, shape, pages, s);
    storage_ = storage;
  }

  AnyCache& c() { return *cache_; }
  const AnyCache& c() const { return *cache_; }
  const registry::Selection& selection() const { return selection_; }
  const std::string& storage() const { return storage_; }
  registry::Inputs inputs() const { return inputs_; }

  /// scores [.., T] for append/step: the given array, or zeros where the policy computes none.
  bool needs_scores() const { return inputs_ != registry::Inputs::none && !cache_->takes_step_scores(); }
  void require_scores(bool given, const char* where) const {
    require(given || !needs_scores(), where, ": policy ", selection_.policy, " ranks by scores the model computes (",
            registry::name_of(inputs_), "): pass scores=");
  }

 private:
  registry::Selection selection_;
  std::unique_ptr<AnyCache> cache_;
  std::string storage_;
  registry::Inputs inputs_ = registry::Inputs::none;
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
    p["inputs"] = std::string(registry::name_of(P::inputs));
    p["needs_prompt_length"] = requires { P::needs_prompt_length; };
    p["options"] = options;
    all[std::string(P::name).c_str()] = p;
  });
  return all;
}

}  // namespace

std::unique_ptr<AnyCache> make_cache(const registry::Selection& selection, const CacheShape& shape, std::int64_t pages,
                                     Storage storage) {
  switch (storage) {
    case Storage::float16: return detail::make_float16(selection, shape, pages);
    case Storage::bfloat16: return detail::make_bfloat16(selection, shape, pages);
    case Storage::float32: break;
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
        "Every registered policy: its help, the inputs its scores need, and its options with defaults.");

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

  nb::class_<KVStatistic>(m, "KVStatistic",
                          "The rolling K/V statistic a policy of the kv-statistics family ranks by (SPEC §4: kv-key, "
                          "kv-val, lag-kv), for one sequence: each new entry's score from its key and value.")
      .def(
          "__init__",
          [](KVStatistic* self, const std::string& policy, int layers, int kv_heads, int q_heads, int head_dim) {
            const CacheShape shape{layers, kv_heads, q_heads, head_dim};
            shape.validate();
            std::unique_ptr<kvstats::Tracker> t;
            registry::visit(policy, [&]<registry::Policy P>() {
              if constexpr (P::inputs == registry::Inputs::key_value_statistic)
                t = std::make_unique<kvstats::Tracker>(shape, kvstats::Config{P::statistic, 64});
              else
                fail("KVStatistic: policy ", policy, " does not rank by a K/V statistic (its inputs: ",
                     registry::name_of(P::inputs), ")");
            });
            new (self) KVStatistic{std::move(t), shape};
          },
          "policy"_a, nb::kw_only(), "layers"_a, "kv_heads"_a, "q_heads"_a, "head_dim"_a)
      .def(
          "__call__",
          [](KVStatistic& s, int layer, const Input& keys, const Input& values) {
            check_array(keys, "keys", 3, {s.shape.kv_heads, -1, s.shape.head_dim}, "kv_heads, T, head_dim");
            const auto T = static_cast<std::int64_t>(keys.shape(1));
            check_array(values, "values", 3, {s.shape.kv_heads, T, s.shape.head_dim}, "kv_heads, T, head_dim");
            std::vector<float> out(static_cast<std::size_t>(s.shape.kv_heads * T));
            s.tracker->push(layer, view_of<3>(keys), view_of<3>(values), View<float, 2>(out.data(), {s.shape.kv_heads, T}));
            return numpy_of(std::move(out), {static_cast<std::size_t>(s.shape.kv_heads), static_cast<std::size_t>(T)});
          },
          "layer"_a, "keys"_a, "values"_a,
          "one layer's new keys/values [kv_heads, T, head_dim] -> their scores [kv_heads, T] (layers in order)");

  nb::class_<HiddenStateSignal>(m, "HiddenStateSignal",
                                "EpiKV's or HS-var's signal (SPEC §4) for one sequence: each token's score from the "
                                "hidden states of bands A and B.")
      .def(
          "__init__",
          [](HiddenStateSignal* self, const std::string& policy, int hidden, int band_a, int band_b) {
            std::unique_ptr<epiphany::Signal> signal;
            registry::visit(policy, [&]<registry::Policy P>() {
              if constexpr (P::inputs == registry::Inputs::hidden_states) {
                epiphany::SignalConfig c;
                c.band_a = band_a;
                c.band_b = band_b;
                c.variant = P::variant;
                signal = std::make_unique<epiphany::Signal>(c, hidden);
              } else {
                fail("HiddenStateSignal: policy ", policy, " does not rank by hidden states (its inputs: ",
                     registry::name_of(P::inputs), ")");
              }
            });
            new (self) HiddenStateSignal{std::move(signal), hidden};
          },
          "policy"_a, nb::kw_only(), "hidden"_a, "band_a"_a, "band_b"_a)
      .def(
          "__call__",
          [](HiddenStateSignal& s, const Input& h_a, const Input& h_b) {
            check_array(h_a, "h_a", 2, {-1, s.hidden}, "T, hidden");
            const auto T = static_cast<std::int64_t>(h_a.shape(0));
            check_array(h_b, "h_b", 2, {T, s.hidden}, "T, hidden");
            std::vector<float> out(static_cast<std::size_t>(T));
            s.signal->push(view_of<2>(h_a), view_of<2>(h_b), std::span<float>(out));
            return numpy_of(std::move(out), {static_cast<std::size_t>(T)});
          },
          "h_a"_a, "h_b"_a, "the step's hidden states at bands A and B [T, hidden] -> each token's score [T]");

  nb::class_<RetentionGateFile>(m, "RetentionGate",
                                "A trained retention gate under SPEC's tensor names (TRIM-KV's rg, SPEC §1; DBTrimKV's "
                                "tied gate, SPEC §2): log beta of each new entry from the layer's normed input.")
      .def(
          "__init__",
          [](RetentionGateFile* self, const std::string& path, int layers, int hidden, int kv_heads, bool tied) {
            new (self) RetentionGateFile{gate::load_retention_gate(path, layers, hidden, kv_heads, tied), hidden, kv_heads};
          },
          "path"_a, nb::kw_only(), "layers"_a, "hidden"_a, "kv_heads"_a, "tied"_a = false)
      .def(
          "__call__",
          [](const RetentionGateFile& g, int layer, const Input& input) {
            check_array(input, "input", 2, {-1, g.hidden}, "T, hidden");
            const auto T = static_cast<std::size_t>(input.shape(0));
            std::vector<float> out(static_cast<std::size_t>(g.kv_heads) * T);
            g.forward(layer, view_of<2>(input),
                      View<float, 2>(out.data(), {g.kv_heads, static_cast<std::int64_t>(T)}));
            return numpy_of(std::move(out), {static_cast<std::size_t>(g.kv_heads), T});
          },
          "layer"_a, "input"_a, "input [T, hidden] (the attention block's input after its RMSNorm) -> log beta [kv_heads, T]");

  nb::class_<gate::WriteGate>(m, "WriteGate",
                              "WG-KV's trained write gate under SPEC's tensor names (SPEC §3): g of each new entry "
                              "from its key before and after RoPE.")
      .def(
          "__init__",
          [](gate::WriteGate* self, const std::string& path, int layers, int kv_heads, int head_dim) {
            new (self) gate::WriteGate(gate::WriteGate::load(safetensors::File::read(path),
                                                             {.layers = layers, .kv_heads = kv_heads, .head_dim = head_dim}));
          },
          "path"_a, nb::kw_only(), "layers"_a, "kv_heads"_a, "head_dim"_a)
      .def(
          "__call__",
          [](const gate::WriteGate& g, int layer, const Input& k_pre, const Input& k) {
            check_array(k_pre, "k_pre", 3, {-1, -1, -1}, "kv_heads, T, head_dim");
            const auto H = static_cast<std::int64_t>(k_pre.shape(0)), T = static_cast<std::int64_t>(k_pre.shape(1));
            check_array(k, "k", 3, {H, T, static_cast<std::int64_t>(k_pre.shape(2))}, "kv_heads, T, head_dim");
            std::vector<float> out(static_cast<std::size_t>(H * T));
            g.forward(layer, view_of<3>(k_pre), view_of<3>(k), View<float, 2>(out.data(), {H, T}));
            return numpy_of(std::move(out), {static_cast<std::size_t>(H), static_cast<std::size_t>(T)});
          },
          "layer"_a, "k_pre"_a, "k"_a, "keys [kv_heads, T, head_dim] before and after RoPE -> g [kv_heads, T]");
}
