// gate/safetensors.hpp: round trips in every dtype and every malformed file the reader names.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "kvpolicy/gate/safetensors.hpp"

using namespace kvpolicy;
namespace st = kvpolicy::safetensors;

namespace {

// A file image from a literal header and a data section.
std::vector<std::uint8_t> image(const std::string& header, std::size_t data_bytes, std::int64_t length_field = -1) {
  const std::uint64_t n = length_field < 0 ? header.size() : static_cast<std::uint64_t>(length_field);
  std::vector<std::uint8_t> b(8 + header.size() + data_bytes, 0);
  for (std::size_t i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(n >> (8 * i));
  std::copy(header.begin(), header.end(), b.begin() + 8);
  return b;
}

void expect_error(const std::vector<std::uint8_t>& bytes, const std::string& message) {
  CHECK_THROWS_WITH_AS(st::File::parse(bytes, "test.safetensors"), doctest::Contains(message.c_str()), Error);
}

}  // namespace

TEST_CASE("safetensors round trip: F32, F16, BF16, I64 and metadata") {
  const std::vector<float> v{1.0f, -2.5f, 0.333333f, 65504.0f, -1e-6f, 3.0e38f};
  st::Writer w;
  w.add_f32("a.f32", {2, 3}, v);
  w.add_f32_as("b.f16", st::DType::F16, {6}, v);
  w.add_f32_as("c.bf16", st::DType::BF16, {3, 2}, v);
  const std::vector<std::int64_t> ids{-1, 0, 1LL << 40};
  w.add_i64("d.i64", {3}, ids);
  w.add_f32("e.empty", {0, 4}, std::vector<float>{});
  w.metadata("format", "pt");
  const auto bytes = w.bytes();
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[static_cast<std::size_t>(i)];
  CHECK((8 + header_len) % 8 == 0);  // header padded: the data section starts 8-aligned
  CHECK(8 + header_len + 6 * 4 + 6 * 2 + 6 * 2 + 3 * 8 == bytes.size());
  const auto f = st::File::parse(bytes);
  CHECK(f.floats("a.f32", {2, 3}) == v);
  const auto h = f.floats("b.f16");
  const auto b = f.floats("c.bf16", {3, 2});
  for (std::size_t i = 0; i < v.size(); ++i) {
    CHECK(h[i] == to_float(from_float<half>(v[i])));
    CHECK(b[i] == to_float(from_float<bfloat16>(v[i])));
  }
  CHECK(f.int64s("d.i64") == ids);
  CHECK(f.floats("e.empty", {0, 4}).empty());
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.names().size() == 5);
}

TEST_CASE("safetensors: a section is the tensors under a prefix, renamed, with the file's metadata") {
  st::Writer w;
  w.add_f32("w", {2}, std::vector<float>{1.0f, 2.0f});
  w.add_f32("tl.w", {3}, std::vector<float>{3.0f, 4.0f, 5.0f});
  w.add_f32_as("tl.inner.b", st::DType::F16, {1}, std::vector<float>{0.5f});
  w.add_f32("tlx", {1}, std::vector<float>{9.0f});  // shares the prefix's letters, not the prefix
  w.metadata("kind", "rg");
  const auto f = st::File::parse(w.bytes(), "gate.safetensors");
  const auto s = f.section("tl.");
  CHECK(s.names() == std::vector<std::string>{"inner.b", "w"});
  CHECK(s.floats("w", {3}) == std::vector<float>{3.0f, 4.0f, 5.0f});
  CHECK(s.floats("inner.b") == std::vector<float>{0.5f});
  CHECK(s.info("w").name == "w");
  CHECK(s.metadata().at("kind") == "rg");
  CHECK_FALSE(s.empty());
  CHECK(f.floats("w") == std::vector<float>{1.0f, 2.0f});  // the file itself unchanged
  CHECK(f.section("none.").empty());
  CHECK_THROWS_WITH_AS(s.floats("tlx"), doctest::Contains("gate.safetensors (tensors tl.*)"), Error);
}

TEST_CASE("safetensors: a hand-built file with known bits in every dtype") {
  // F16 1.0 = 0x3C00, F16 -2.0 = 0xC000, BF16 1.0 = 0x3F80, BF16 -0.5 = 0xBF00, F32 0.5, I32 -7, I64 2^40
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},)"
      R"("f":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"i":{"dtype":"I32","shape":[1],"data_offsets":[12,16]},)"
      R"("l":{"dtype":"I64","shape":[1],"data_offsets":[16,24]}})";
  auto bytes = image(header, 24);
  const std::uint8_t data[24] = {0x00, 0x3C, 0x00, 0xC0, 0x80, 0x3F, 0x00, 0xBF, 0x00, 0x00, 0x00, 0x3F,
                                 0xF9, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0, 1, 0, 0};
  std::copy(data, data + 24, bytes.end() - 24);
  const auto f = st::File::parse(bytes);
  CHECK(f.floats("h") == std::vector<float>{1.0f, -2.0f});
  CHECK(f.floats("b") == std::vector<float>{1.0f, -0.5f});
  CHECK(f.floats("f") == std::vector<float>{0.5f});
  CHECK(f.int64s("i") == std::vector<std::int64_t>{-7});
  CHECK(f.int64s("l") == std::vector<std::int64_t>{std::int64_t{1} << 40});
  CHECK_THROWS_WITH_AS(f.floats("l"), doctest::Contains("tensor 'l' has dtype I64, expected F32, F16, BF16 or F64"), Error);
}

TEST_CASE("safetensors writer rejects what it cannot write") {
  st::Writer w;
  w.add_f32("a", {1}, std::vector<float>{1.0f});
  CHECK_THROWS_WITH_AS(w.add_f32("a", {1}, std::vector<float>{1.0f}), doctest::Contains("'a' is used twice"), Error);
  CHECK_THROWS_WITH_AS(w.add_f32("__metadata__", {1}, std::vector<float>{1.0f}), doctest::Contains("reserved"), Error);
  CHECK_THROWS_WITH_AS(w.add_f32("c", {2, 2}, std::vector<float>{1.0f}), doctest::Contains("has 1 values, shape [2, 2] needs 4"), Error);
  CHECK_THROWS_WITH_AS(w.add_f32_as("d", st::DType::I64, {1}, std::vector<float>{1.0f}), doctest::Contains("cannot store 'd' as I64"), Error);
}

TEST_CASE("safetensors: every malformed file is an error naming the tensor and the problem") {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK_NOTHROW(st::File::parse(image(ok, 8)));
  expect_error({1, 2, 3}, "truncated file: 3 bytes");
  expect_error(image(ok, 8, 1000), "header length 1000 exceeds the 62 bytes after the length field");
  expect_error(image(ok, 8, std::numeric_limits<std::int64_t>::max()), "header length");
  expect_error(image("{\"w\": [", 0), "header is not valid JSON");
  expect_error(image("[1,2]", 0), "header is not a JSON object");
  expect_error(image(R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2), "tensor 'w': unknown dtype 'F8_E4M3'");
  // JSON would keep the last of two equal keys: a tensor named twice is refused
  expect_error(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
               "header names 'w' twice");
  expect_error(image(R"({"w":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8), "header names 'dtype' twice");
  expect_error(image(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8), "tensor 'w': missing dtype");
  expect_error(image(R"({"w":[1]})", 0), "tensor 'w': entry is not an object");
  expect_error(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "data_offsets must be [begin, end]");
  expect_error(image(R"({"__metadata__":[1]})", 0), "__metadata__ is not an object");
  expect_error(image(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "tensor 'w': shape entry -2");
  expect_error(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8),
               "tensor 'w': data_offsets [0, 16] out of range: the data section holds 8 bytes");
  expect_error(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "begin > end");
  expect_error(image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "shape [3] of F32 needs 12");
  expect_error(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8), "data offset -8");
  expect_error(image(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8), "overflows");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               "data of tensor 'b' [4, 12) overlaps tensor 'a' [0, 8)");
  // an empty tensor between two overlapping ones does not hide the overlap
  expect_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               "data of tensor 'b' [4, 8) overlaps tensor 'a' [0, 8)");
  const auto f = st::File::parse(image(ok, 8), "x.safetensors");
  CHECK_THROWS_WITH_AS(f.floats("v"), doctest::Contains("'x.safetensors': tensor 'v' is missing"), Error);
  CHECK_THROWS_WITH_AS(f.floats("w", {3}), doctest::Contains("tensor 'w' has shape [2], expected [3]"), Error);
  CHECK_THROWS_WITH_AS(f.int64s("w"), doctest::Contains("tensor 'w' has dtype F32, expected I64 or I32"), Error);
  CHECK_THROWS_WITH_AS(st::File::read("/nonexistent/file.safetensors"), doctest::Contains("cannot open"), Error);
  CHECK_THROWS_WITH_AS(st::File::read("/tmp"), doctest::Contains("'/tmp' is a directory, not a file"), Error);
  // the same key in two different objects is fine
  CHECK_NOTHROW(st::File::parse(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)));
}

TEST_CASE("safetensors: F64 tensors are read as fp32, rounded to nearest") {
  const double v[3] = {1.0, -0.1, 1e300};
  auto bytes = image(R"({"d":{"dtype":"F64","shape":[3],"data_offsets":[0,24]}})", 24);
  std::memcpy(bytes.data() + bytes.size() - 24, v, 24);
  const auto f = st::File::parse(bytes);
  CHECK(f.info("d").dtype == st::DType::F64);
  const auto x = f.floats("d", {3});
  CHECK(x[0] == 1.0f);
  CHECK(x[1] == static_cast<float>(-0.1));
  CHECK(std::isinf(x[2]));
  CHECK_THROWS_WITH_AS(f.floats("d", {3}, /*finite=*/true), doctest::Contains("non-finite value inf at flat index 2"), Error);
}

TEST_CASE("safetensors: U8 tensors are bytes for the caller (raw), never floats") {
  st::Writer w;
  const std::vector<std::uint8_t> blocks{0x00, 0x3c, 0xff, 0x0f, 7};
  w.add("b", st::DType::U8, {1, 5}, blocks.data());
  w.metadata("b", "Q4_1");
  const auto f = st::File::parse(w.bytes());
  CHECK(f.info("b").dtype == st::DType::U8);
  CHECK(f.info("b").shape == std::vector<std::int64_t>{1, 5});
  const auto raw = f.raw("b");
  CHECK(std::vector<std::uint8_t>(raw.begin(), raw.end()) == blocks);
  CHECK(f.metadata().at("b") == "Q4_1");
  CHECK_THROWS_WITH_AS(f.floats("b"), doctest::Contains("tensor 'b' has dtype U8, expected F32, F16, BF16 or F64"), Error);
  expect_error(image(R"({"u":{"dtype":"U8","shape":[3],"data_offsets":[0,2]}})", 2), "tensor 'u'");  // 3 bytes declared, 2 held
}

TEST_CASE("safetensors writer: atomic — a failed write leaves the old file, and no temporary behind") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kvpolicy_atomic_write_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "out.safetensors").string();
  st::Writer first, second;
  first.add_f32("a", {1}, std::vector<float>{1.0f});
  second.add_f32("a", {1}, std::vector<float>{2.0f});
  first.write(path);
  second.write(path);  // replaces it
  CHECK(st::File::read(path).floats("a") == std::vector<float>{2.0f});
  CHECK(!fs::exists(path + ".tmp-kvpolicy"));
  // the temporary cannot be created: the error names the file, and the old one is intact
  fs::create_directory(path + ".tmp-kvpolicy");
  CHECK_THROWS_WITH_AS(first.write(path), doctest::Contains("cannot open a temporary file to write '"), Error);
  CHECK(st::File::read(path).floats("a") == std::vector<float>{2.0f});
  CHECK_THROWS_WITH_AS(first.write(dir.string()), doctest::Contains("is a directory"), Error);
  CHECK_THROWS_WITH_AS(first.write((dir / "missing" / "x.safetensors").string()), doctest::Contains("cannot open a temporary"), Error);
  CHECK(!fs::exists(dir / "missing"));
  fs::remove_all(dir);
}

TEST_CASE("safetensors: non-finite values are rejected where finite is required") {
  st::Writer w;
  w.add_f32("w", {3}, std::vector<float>{1.0f, std::numeric_limits<float>::infinity(), 0.0f});
  const auto f = st::File::parse(w.bytes());
  CHECK(f.floats("w").size() == 3);
  CHECK_THROWS_WITH_AS(f.floats("w", {3}, true), doctest::Contains("tensor 'w' holds a non-finite value inf at flat index 1"), Error);
}
