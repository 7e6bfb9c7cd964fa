/// \file
/// kvpolicy/gate/safetensors.hpp — a bounds-checked safetensors reader and writer.
/// Format: u64 little-endian header length N, N bytes of JSON header
///   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
/// then the data; offsets are relative to the first byte after the header.
/// Every malformed file gives kvpolicy::Error naming the tensor (or file) and the problem; nothing
/// reads outside the buffer: all offsets are checked against the file size before any access.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/error.hpp"

namespace kvpolicy::safetensors {

enum class DType { F32, F16, BF16, I32, I64, F64, U8 };

inline std::int64_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::I64: case DType::F64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::F64: return "F64";
    case DType::U8: return "U8";
  }
  return "?";
}

/// One tensor of a safetensors file: its name, dtype, shape and byte range in the data section.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::int64_t begin = 0;  // byte offsets into the data section
  std::int64_t end = 0;
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }
};

inline std::string shape_string(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// A safetensors file, read whole and validated; its tensors are read by name with their shape checked.
/// It reads F32, F16, BF16, F64, I32, I64 and U8. Immutable once read: any number of threads may read it.
class File {
 public:
  /// Reads and validates a whole file. read and parse throw, naming the file and tensor, for a
  /// directory or a file that cannot be opened; a truncated file or header; JSON that is invalid or not
  /// an object; a tensor named twice; an unknown dtype; a shape or offsets that are invalid or
  /// overflow; a byte range that disagrees with the shape; overlapping tensors.
  static File read(const std::string& path) {
    std::error_code ec;
    require(!std::filesystem::is_directory(path, ec), "safetensors: '", path, "' is a directory, not a file");
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    require(in.good(), "safetensors: cannot open '", path, "'");
    // one read of the whole image: a model's file is hundreds of MB, which a byte-wise copy into a
    // growing vector takes seconds to read
    const std::streamoff size = in.tellg();
    require(size >= 0, "safetensors: cannot size '", path, "'");
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
    in.seekg(0);
    if (size > 0) in.read(reinterpret_cast<char*>(bytes.data()), size);
    require(in.good(), "safetensors: cannot read ", size, " bytes of '", path, "'");
    return parse(std::move(bytes), path);
  }

  /// Validates a file image held in memory; `source` names it in error messages.
  static File parse(std::vector<std::uint8_t> bytes, std::string source = "<memory>") {
    File f;
    f.source_ = std::move(source);
    f.bytes_ = std::move(bytes);
    f.index();
    return f;
  }

  const std::string& source() const { return source_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& kv : tensors_) out.push_back(kv.first);
    return out;
  }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// The tensors named `prefix` + name, each under its name without the prefix, and the file's
  /// metadata: a second set of weights a file holds beside its first (SPEC §8's token-level gate).
  /// Empty (no tensor) when no name has the prefix; errors name the file and the prefix.
  File section(const std::string& prefix) const {
    File f = *this;
    f.source_ = source_ + " (tensors " + prefix + "*)";
    f.tensors_.clear();
    for (const auto& [name, t] : tensors_) {
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      TensorInfo renamed = t;
      renamed.name = name.substr(prefix.size());
      f.tensors_.emplace(renamed.name, std::move(renamed));
    }
    return f;
  }
  bool empty() const { return tensors_.empty(); }

  const TensorInfo& info(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) fail("safetensors '", source_, "': tensor '", name, "' is missing");
    return it->second;
  }

  /// The tensor as fp32 (from F32, F16, BF16, or F64 rounded to nearest). With `expected` non-empty the shape must match; with
  /// finite = true every value must be finite (gate weights). info, floats and int64s throw for a missing
  /// tensor, a shape other than `expected`, a wrong dtype, or (finite) a value that is not finite.
  std::vector<float> floats(const std::string& name, const std::vector<std::int64_t>& expected = {},
                            bool finite = false) const {
    const TensorInfo& t = checked(name, expected);
    const std::uint8_t* p = data() + t.begin;
    std::vector<float> out(static_cast<std::size_t>(t.numel()));
    switch (t.dtype) {
      case DType::F32:
        if (!out.empty()) std::memcpy(out.data(), p, 4 * out.size());  // an empty vector's data() may be null
        break;
      case DType::F16:
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = dtype::half_to_float(load_u16(p + 2 * i));
        break;
      case DType::BF16:
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = dtype::bf16_to_float(load_u16(p + 2 * i));
        break;
      case DType::F64:
        for (std::size_t i = 0; i < out.size(); ++i) {
          double x;
          std::memcpy(&x, p + 8 * i, 8);
          out[i] = static_cast<float>(x);
        }
        break;
      default:
        fail("safetensors '", source_, "': tensor '", name, "' has dtype ", dtype_name(t.dtype),
             ", expected F32, F16, BF16 or F64");
    }
    if (finite)
      for (std::size_t i = 0; i < out.size(); ++i)
        if (!std::isfinite(out[i]))
          fail("safetensors '", source_, "': tensor '", name, "' holds a non-finite value ", out[i], " at flat index ", i);
    return out;
  }

  /// The tensor's bytes as stored (little-endian, row-major), any dtype (U8: bytes the caller decodes,
  /// e.g. kvpolicy-lm's ggml blocks).
  std::span<const std::uint8_t> raw(const std::string& name) const {
    const TensorInfo& t = info(name);
    return {data() + t.begin, static_cast<std::size_t>(t.end - t.begin)};
  }

  /// The tensor as int64, from I64 or I32.
  std::vector<std::int64_t> int64s(const std::string& name, const std::vector<std::int64_t>& expected = {}) const {
    const TensorInfo& t = checked(name, expected);
    require(t.dtype == DType::I64 || t.dtype == DType::I32, "safetensors '", source_, "': tensor '", name,
            "' has dtype ", dtype_name(t.dtype), ", expected I64 or I32");
    std::vector<std::int64_t> out(static_cast<std::size_t>(t.numel()));
    const std::uint8_t* p = data() + t.begin;
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (t.dtype == DType::I64) {
        std::memcpy(&out[i], p + 8 * i, 8);
      } else {
        std::int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        out[i] = v;
      }
    }
    return out;
  }

 private:
  static std::uint16_t load_u16(const std::uint8_t* p) {
    std::uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  const std::uint8_t* data() const { return bytes_.data() + 8 + header_len_; }

  const TensorInfo& checked(const std::string& name, const std::vector<std::int64_t>& expected) const {
    const TensorInfo& t = info(name);
    if (!expected.empty() && t.shape != expected)
      fail("safetensors '", source_, "': tensor '", name, "' has shape ", shape_string(t.shape), ", expected ",
           shape_string(expected));
    return t;
  }

  void index() {
    const auto size = static_cast<std::int64_t>(bytes_.size());
    require(size >= 8, "safetensors '", source_, "': truncated file: ", size, " bytes, the header length alone takes 8");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes_[static_cast<std::size_t>(i)];
    require(n <= static_cast<std::uint64_t>(size - 8), "safetensors '", source_, "': header length ", n,
            " exceeds the ", size - 8, " bytes after the length field");
    header_len_ = static_cast<std::int64_t>(n);
    const std::int64_t data_size = size - 8 - header_len_;

    // JSON keeps the last of two equal keys; a tensor named twice is an error instead (which of the
    // two was meant cannot be known).
    nlohmann::json header;
    std::string twice;
    std::vector<std::set<std::string>> keys_of_open_objects;
    const auto no_duplicate_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      using E = nlohmann::json::parse_event_t;
      if (event == E::object_start) keys_of_open_objects.emplace_back();
      if (event == E::object_end && !keys_of_open_objects.empty()) keys_of_open_objects.pop_back();
      if (event == E::key && !keys_of_open_objects.empty() && twice.empty() &&
          !keys_of_open_objects.back().insert(parsed.get<std::string>()).second)
        twice = parsed.get<std::string>();
      return true;
    };
    try {
      header = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + 8 + header_len_, no_duplicate_keys);
    } catch (const nlohmann::json::exception& e) {
      fail("safetensors '", source_, "': header is not valid JSON: ", e.what());
    }
    require(twice.empty(), "safetensors '", source_, "': header names '", twice, "' twice");
    require(header.is_object(), "safetensors '", source_, "': header is not a JSON object");

    std::vector<const TensorInfo*> by_offset;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        require(it->is_object(), "safetensors '", source_, "': __metadata__ is not an object");
        for (auto m = it->begin(); m != it->end(); ++m)
          if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
        continue;
      }
      TensorInfo t = parse_entry(it.key(), *it, data_size);
      tensors_.emplace(t.name, std::move(t));
    }
    // Non-empty ranges sorted by begin overlap iff some neighbours do (empty ones hold no bytes).
    for (const auto& kv : tensors_)
      if (kv.second.end > kv.second.begin) by_offset.push_back(&kv.second);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (std::size_t i = 1; i < by_offset.size(); ++i) {
      const TensorInfo& a = *by_offset[i - 1];
      const TensorInfo& b = *by_offset[i];
      require(b.begin >= a.end, "safetensors '", source_,
              "': data of tensor '", b.name, "' [", b.begin, ", ", b.end, ") overlaps tensor '", a.name, "' [",
              a.begin, ", ", a.end, ")");
    }
  }

  TensorInfo parse_entry(const std::string& name, const nlohmann::json& e, std::int64_t data_size) const {
    const std::string where = "safetensors '" + source_ + "': tensor '" + name + "'";
    require(e.is_object(), where, ": entry is not an object");
    require(e.contains("dtype") && e["dtype"].is_string(), where, ": missing dtype");
    require(e.contains("shape") && e["shape"].is_array(), where, ": missing shape");
    require(e.contains("data_offsets") && e["data_offsets"].is_array() && e["data_offsets"].size() == 2, where,
            ": data_offsets must be [begin, end]");
    TensorInfo t;
    t.name = name;
    const auto dt = e["dtype"].get<std::string>();
    if (dt == "F32") t.dtype = DType::F32;
    else if (dt == "F16") t.dtype = DType::F16;
    else if (dt == "BF16") t.dtype = DType::BF16;
    else if (dt == "I32") t.dtype = DType::I32;
    else if (dt == "I64") t.dtype = DType::I64;
    else if (dt == "F64") t.dtype = DType::F64;
    else if (dt == "U8") t.dtype = DType::U8;  // bytes a caller decodes (raw()), e.g. ggml blocks
    else fail(where, ": unknown dtype '", dt, "' (supported: F32, F16, BF16, F64, I32, I64, U8)");

    std::int64_t numel = 1;
    for (const auto& d : e["shape"]) {
      require(d.is_number_integer() && d.get<std::int64_t>() >= 0, where, ": shape entry ", d.dump(),
              " is not a non-negative integer");
      const auto v = d.get<std::int64_t>();
      require(v == 0 || numel <= std::numeric_limits<std::int64_t>::max() / 8 / v, where, ": shape ",
              e["shape"].dump(), " overflows");
      numel *= v;
      t.shape.push_back(v);
    }
    for (const auto& o : e["data_offsets"])
      require(o.is_number_unsigned() || (o.is_number_integer() && o.get<std::int64_t>() >= 0), where,
              ": data offset ", o.dump(), " is not a non-negative integer");
    const auto b = e["data_offsets"][0].get<std::uint64_t>();
    const auto en = e["data_offsets"][1].get<std::uint64_t>();
    require(b <= en, where, ": data_offsets [", b, ", ", en, "] has begin > end");
    require(en <= static_cast<std::uint64_t>(data_size), where, ": data_offsets [", b, ", ", en,
            "] out of range: the data section holds ", data_size, " bytes");
    t.begin = static_cast<std::int64_t>(b);
    t.end = static_cast<std::int64_t>(en);
    require(t.end - t.begin == numel * dtype_size(t.dtype), where, ": data_offsets [", b, ", ", en, "] hold ",
            t.end - t.begin, " bytes, shape ", shape_string(t.shape), " of ", dt, " needs ",
            numel * dtype_size(t.dtype));
    return t;
  }

  std::string source_;
  std::vector<std::uint8_t> bytes_;
  std::int64_t header_len_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Builds a safetensors file: add tensors, then bytes() or write(path). Tensors are laid out in the
/// order added; the header is padded with spaces to a multiple of 8 so the data stays aligned. Use a
/// Writer from one thread at a time.
class Writer {
 public:
  /// Reads numel * dtype_size bytes from `data`, unchecked. Throws for a name used twice (or
  /// `__metadata__`) and for a negative extent; add_f32 and add_f32_as also when the value count does not
  /// match the shape, add_f32_as when the dtype is not F32, F16 or BF16.
  void add(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape, const void* data) {
    require(!names_.count(name) && name != "__metadata__", "safetensors writer: tensor name '", name,
            "' is used twice or reserved");
    std::int64_t numel = 1;
    for (auto e : shape) {
      require(e >= 0, "safetensors writer: tensor '", name, "' has negative extent ", e);
      numel *= e;
    }
    const std::int64_t nbytes = numel * dtype_size(dtype);
    const auto begin = static_cast<std::int64_t>(data_.size());
    const auto* p = static_cast<const std::uint8_t*>(data);
    data_.insert(data_.end(), p, p + nbytes);
    header_[name] = {{"dtype", dtype_name(dtype)}, {"shape", shape}, {"data_offsets", {begin, begin + nbytes}}};
    names_[name] = true;
  }
  void add_f32(const std::string& name, const std::vector<std::int64_t>& shape, std::span<const float> v) {
    check_count(name, shape, v.size());
    add(name, DType::F32, shape, v.data());
  }
  void add_i64(const std::string& name, const std::vector<std::int64_t>& shape, std::span<const std::int64_t> v) {
    check_count(name, shape, v.size());
    add(name, DType::I64, shape, v.data());
  }
  /// fp32 values stored as F16 or BF16 (round to nearest even).
  void add_f32_as(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape, std::span<const float> v) {
    check_count(name, shape, v.size());
    if (dtype == DType::F32) return add(name, dtype, shape, v.data());
    require(dtype == DType::F16 || dtype == DType::BF16, "safetensors writer: cannot store '", name, "' as ",
            dtype_name(dtype));
    std::vector<std::uint16_t> bits(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      bits[i] = dtype == DType::F16 ? dtype::float_to_half(v[i]) : dtype::float_to_bf16(v[i]);
    add(name, dtype, shape, bits.data());
  }
  void metadata(const std::string& key, const std::string& value) { header_["__metadata__"][key] = value; }

  std::vector<std::uint8_t> bytes() const {
    std::string h = header_.empty() ? std::string("{}") : header_.dump();
    while ((8 + h.size()) % 8 != 0) h.push_back(' ');
    const std::uint64_t n = h.size();
    std::vector<std::uint8_t> out(8 + h.size() + data_.size());
    for (std::size_t i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(n >> (8 * i));
    std::copy(h.begin(), h.end(), out.begin() + 8);
    std::copy(data_.begin(), data_.end(), out.begin() + 8 + static_cast<std::ptrdiff_t>(h.size()));
    return out;
  }
  /// Writes atomically: the bytes go to the temporary file `path` + ".tmp-kvpolicy", which then
  /// replaces `path` by rename (a symbolic link at `path` is replaced, not followed). A failed write
  /// leaves an existing file at `path` as it was, and no temporary behind.
  void write(const std::string& path) const {
    namespace fs = std::filesystem;
    std::error_code ec;
    require(!fs::is_directory(path, ec), "safetensors writer: '", path, "' is a directory");
    const auto b = bytes();
    const std::string tmp = path + ".tmp-kvpolicy";
    const auto give_up = [&](const char* what) {
      fs::remove(tmp, ec);
      fail("safetensors writer: ", what, " '", path, "'");
    };
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out.good()) give_up("cannot open a temporary file to write");
      out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
      out.close();
      if (out.fail()) give_up("failed writing");
    }
    fs::rename(tmp, path, ec);
    if (ec) give_up("cannot replace");
  }

 private:
  static void check_count(const std::string& name, const std::vector<std::int64_t>& shape, std::size_t n) {
    std::int64_t numel = 1;
    for (auto e : shape) numel *= e;
    require(numel == static_cast<std::int64_t>(n), "safetensors writer: tensor '", name, "' has ", n,
            " values, shape ", shape_string(shape), " needs ", numel);
  }
  nlohmann::ordered_json header_ = nlohmann::ordered_json::object();
  std::map<std::string, bool> names_;
  std::vector<std::uint8_t> data_;
};

}  // namespace kvpolicy::safetensors
