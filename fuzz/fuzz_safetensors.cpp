// libFuzzer target: the safetensors reader (kvpolicy/gate/safetensors.hpp).
// Contract under test: any byte string either parses, or throws kvpolicy::Error; nothing else (no
// crash, no out-of-bounds read, no other exception). A file that parses reads back through every
// accessor, and writing its tensors again gives a file that parses to the same tensors.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kvpolicy/gate/safetensors.hpp"

using namespace kvpolicy;

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

void read_all(const safetensors::File& f) {
  for (const auto& name : f.names()) {
    const auto& t = f.info(name);
    try {
      const auto v = f.floats(name);
      check(static_cast<std::int64_t>(v.size()) == t.numel());
    } catch (const Error&) {
      check(t.dtype == safetensors::DType::I32 || t.dtype == safetensors::DType::I64);
    }
    try {
      const auto v = f.int64s(name, t.shape);
      check(static_cast<std::int64_t>(v.size()) == t.numel());
    } catch (const Error&) {
      check(t.dtype != safetensors::DType::I32 && t.dtype != safetensors::DType::I64);
    }
    try {
      (void)f.floats(name, t.shape, /*finite=*/true);
    } catch (const Error&) {
    }
  }
}

// write(parse(x)) parses to the same names, dtypes, shapes and bytes.
void round_trip(const safetensors::File& f) {
  safetensors::Writer w;
  for (const auto& name : f.names()) {
    const auto& t = f.info(name);
    w.add(name, t.dtype, t.shape, f.raw(name).data());
  }
  for (const auto& [k, v] : f.metadata()) w.metadata(k, v);
  const auto again = safetensors::File::parse(w.bytes(), "round trip");
  check(again.names() == f.names());
  check(again.metadata() == f.metadata());
  for (const auto& name : f.names()) {
    check(again.info(name).dtype == f.info(name).dtype);
    check(again.info(name).shape == f.info(name).shape);
    const auto a = again.raw(name), b = f.raw(name);
    check(a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::optional<safetensors::File> f;
  try {
    f.emplace(safetensors::File::parse(std::vector<std::uint8_t>(data, data + size), "fuzz"));
  } catch (const Error&) {
    return 0;
  }
  read_all(*f);
  round_trip(*f);
  return 0;
}
