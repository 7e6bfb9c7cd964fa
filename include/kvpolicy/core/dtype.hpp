/// \file
/// kvpolicy/core/dtype.hpp — storage dtypes for K/V on the host: float, half (IEEE binary16) and
/// bfloat16, with round-to-nearest-even conversion. Scores and accumulation are always fp32
/// (SPEC, Notation); these types only say how K/V sit in memory. A cache picks one with its
/// allocator's Storage (memory::Paged<16, half>).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "kvpolicy/core/math.hpp"

namespace kvpolicy {

/// IEEE binary16 K/V storage: the bits alone (the conversions are below).
struct half {
  std::uint16_t bits = 0;
};
/// bfloat16 K/V storage: the bits alone (the conversions are below).
struct bfloat16 {
  std::uint16_t bits = 0;
};
/// The storage "type" of a cache that keeps no K/V: the engine owns them (its cells, blocks or
/// pools) and the cache keeps each entry's metadata only (docs/integration.md, "Over the engine's
/// own K/V"). memory::Paged<16, engine_owned> is such a cache's allocator.
struct engine_owned {};

namespace dtype {

KVPOLICY_HD std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
KVPOLICY_HD float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

KVPOLICY_HD float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // subnormal: value = mant * 2^-24
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return (sign != 0u) ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

KVPOLICY_HD std::uint16_t float_to_half(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u)  // inf or nan (keep nan quiet)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero, RNE on 2^-24 units
    const float a = bits_float(abs);
    const float scaled = a * 16777216.0f;  // exact: a * 2^24
    auto m = static_cast<std::uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<std::uint16_t>(sign | m);
  }
  /// normal: rebias exponent, round mantissa 23 -> 10 bits to nearest even
  std::uint32_t r = abs - 0x38000000u;  // exponent 127 -> 15
  const std::uint32_t lsb = (r >> 13) & 1u;
  r += 0xfffu + lsb;
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

KVPOLICY_HD float bf16_to_float(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }

KVPOLICY_HD std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet nan
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
}

}  // namespace dtype

/// to_float / from_float: the one conversion point for every storage type.
KVPOLICY_HD float to_float(float x) { return x; }
KVPOLICY_HD float to_float(half x) { return dtype::half_to_float(x.bits); }
KVPOLICY_HD float to_float(bfloat16 x) { return dtype::bf16_to_float(x.bits); }

template <class T>
KVPOLICY_HD T from_float(float x);
template <>
KVPOLICY_HD float from_float<float>(float x) { return x; }
template <>
KVPOLICY_HD half from_float<half>(float x) { return half{dtype::float_to_half(x)}; }
template <>
KVPOLICY_HD bfloat16 from_float<bfloat16>(float x) { return bfloat16{dtype::float_to_bf16(x)}; }

template <class T>
inline constexpr bool is_storage_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// Whether a cache whose storage type is T holds the entries' K/V (false: the engine holds them).
template <class T>
inline constexpr bool stores_kv_v = !std::is_same_v<T, engine_owned>;

template <class T>
constexpr std::string_view dtype_name() {
  if constexpr (std::is_same_v<T, engine_owned>) return "engine-owned";
  else if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, half>) return "float16";
  else return "bfloat16";
}

}  // namespace kvpolicy
