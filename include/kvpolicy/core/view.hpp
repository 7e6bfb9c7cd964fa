/// \file
/// kvpolicy/core/view.hpp — non-owning, row-major tensor views over memory someone else owns.
/// The engine (or a test) owns every buffer; the library reads and writes through these.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

#include "kvpolicy/core/error.hpp"

namespace kvpolicy {

/// A rank-Rank tensor as a pointer and a row-major shape; it owns nothing (the engine owns the memory).
/// A default-constructed view is empty (null, shape all 0): how an optional argument (gate, queries)
/// is left out.
template <class T, int Rank>
struct View {
  static_assert(Rank >= 1 && Rank <= 4, "View supports ranks 1..4");
  T* data = nullptr;
  std::array<std::int64_t, Rank> shape{};

  constexpr View() = default;
  constexpr View(T* d, std::array<std::int64_t, Rank> s) : data(d), shape(s) {}
  /// A View<T> converts to a View<const T>.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr View(const View<U, Rank>& o) : data(o.data), shape(o.shape) {}

  constexpr std::int64_t size() const {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }
  constexpr std::int64_t dim(int i) const { return shape[static_cast<std::size_t>(i)]; }
  constexpr bool empty() const { return size() == 0; }

  /// Row-major offset; callers validate shapes at the API boundary, so no check here.
  template <class... I>
  constexpr std::int64_t offset(I... idx) const {
    static_assert(sizeof...(I) == Rank, "wrong number of indices");
    const std::array<std::int64_t, Rank> ix{static_cast<std::int64_t>(idx)...};
    std::int64_t off = 0;
    for (int r = 0; r < Rank; ++r) off = off * shape[static_cast<std::size_t>(r)] + ix[static_cast<std::size_t>(r)];
    return off;
  }
  template <class... I>
  constexpr T& operator()(I... idx) const {
    return data[offset(idx...)];
  }

  std::string shape_string() const {
    std::ostringstream o;
    o << '[';
    for (int r = 0; r < Rank; ++r) o << (r ? ", " : "") << shape[static_cast<std::size_t>(r)];
    o << ']';
    return o.str();
  }
};

/// Throws unless `v` has exactly `expected` shape, or if it is null and not empty; `what` names the
/// argument in the message.
template <class T, int Rank>
void require_shape(const View<T, Rank>& v, const std::type_identity_t<std::array<std::int64_t, Rank>>& expected,
                   const char* what) {
  if (v.shape != expected) {
    View<T, Rank> e{nullptr, expected};
    fail(what, " has shape ", v.shape_string(), ", expected ", e.shape_string());
  }
  require(v.data != nullptr || v.size() == 0, what, " is a null view of shape ", v.shape_string());
}

/// Throws unless every element of `v` is finite, naming the first that is not.
template <class T, int Rank>
void require_finite(const View<T, Rank>& v, const char* what) {
  for (std::int64_t i = 0; i < v.size(); ++i)
    require(std::isfinite(static_cast<double>(v.data[i])), what, " holds ", v.data[i], " at flat index ", i);
}

}  // namespace kvpolicy
