// An RGB image with just enough drawing for a heatmap's legend: filled rectangles and text in a
// 3×5 bitmap font (upper-case letters, digits and a little punctuation), drawn at an integer scale.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvpolicy/core/error.hpp"

namespace kvpolicy::replay {

struct Rgb {
  std::uint8_t r, g, b;
  friend bool operator==(Rgb, Rgb) = default;
};

namespace font {

inline constexpr int kWidth = 3, kHeight = 5;

/// One glyph: five rows of three bits, top row first, the left pixel the high bit of its row.
constexpr std::uint16_t glyph(int r0, int r1, int r2, int r3, int r4) {
  return static_cast<std::uint16_t>(r0 << 12 | r1 << 9 | r2 << 6 | r3 << 3 | r4);
}

/// The glyph of c (lower case drawn as upper case); the label must use only these characters.
inline std::uint16_t glyph_of(char c) {
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  static constexpr std::array<std::uint16_t, 26> letters = {
      glyph(2, 5, 7, 5, 5), glyph(6, 5, 6, 5, 6), glyph(3, 4, 4, 4, 3), glyph(6, 5, 5, 5, 6), glyph(7, 4, 6, 4, 7),
      glyph(7, 4, 6, 4, 4), glyph(3, 4, 5, 5, 3), glyph(5, 5, 7, 5, 5), glyph(7, 2, 2, 2, 7), glyph(1, 1, 1, 5, 2),
      glyph(5, 5, 6, 5, 5), glyph(4, 4, 4, 4, 7), glyph(5, 7, 7, 5, 5), glyph(6, 5, 5, 5, 5), glyph(2, 5, 5, 5, 2),
      glyph(6, 5, 6, 4, 4), glyph(2, 5, 5, 6, 3), glyph(6, 5, 6, 5, 5), glyph(3, 4, 2, 1, 6), glyph(7, 2, 2, 2, 2),
      glyph(5, 5, 5, 5, 7), glyph(5, 5, 5, 5, 2), glyph(5, 5, 7, 7, 5), glyph(5, 5, 2, 5, 5), glyph(5, 5, 2, 2, 2),
      glyph(7, 1, 2, 4, 7)};
  static constexpr std::array<std::uint16_t, 10> digits = {
      glyph(7, 5, 5, 5, 7), glyph(2, 6, 2, 2, 7), glyph(7, 1, 7, 4, 7), glyph(7, 1, 7, 1, 7), glyph(5, 5, 7, 1, 1),
      glyph(7, 4, 7, 1, 7), glyph(7, 4, 7, 5, 7), glyph(7, 1, 1, 2, 2), glyph(7, 5, 7, 5, 7), glyph(7, 5, 7, 1, 7)};
  if (c >= 'A' && c <= 'Z') return letters[static_cast<std::size_t>(c - 'A')];
  if (c >= '0' && c <= '9') return digits[static_cast<std::size_t>(c - '0')];
  switch (c) {
    case ' ': return 0;
    case '.': return glyph(0, 0, 0, 0, 2);
    case ',': return glyph(0, 0, 0, 2, 4);
    case ':': return glyph(0, 2, 0, 2, 0);
    case '-': return glyph(0, 0, 7, 0, 0);
    case '=': return glyph(0, 7, 0, 7, 0);
    case '^': return glyph(2, 5, 0, 0, 0);
    case '(': return glyph(1, 2, 2, 2, 1);
    case ')': return glyph(4, 2, 2, 2, 4);
    case '/': return glyph(1, 1, 2, 4, 4);
    default: throw Error("replay: the legend font has no glyph for '" + std::string(1, c) + "'");
  }
}

}  // namespace font

struct Image {
  int width = 0, height = 0;
  std::vector<Rgb> px;

  Image(int w, int h, Rgb background)
      : width(w), height(h), px(static_cast<std::size_t>(w) * static_cast<std::size_t>(h), background) {}

  Rgb& at(int x, int y) { return px[static_cast<std::size_t>(y) * static_cast<std::size_t>(width) + static_cast<std::size_t>(x)]; }
  Rgb at(int x, int y) const {
    return px[static_cast<std::size_t>(y) * static_cast<std::size_t>(width) + static_cast<std::size_t>(x)];
  }

  /// Fills [x, x + w) × [y, y + h), clipped to the image.
  void fill(int x, int y, int w, int h, Rgb c) {
    for (int j = std::max(y, 0); j < std::min(y + h, height); ++j)
      for (int i = std::max(x, 0); i < std::min(x + w, width); ++i) at(i, j) = c;
  }

  /// A one-pixel outline of [x, x + w) × [y, y + h).
  void outline(int x, int y, int w, int h, Rgb c) {
    fill(x, y, w, 1, c);
    fill(x, y + h - 1, w, 1, c);
    fill(x, y, 1, h, c);
    fill(x + w - 1, y, 1, h, c);
  }

  /// Draws `text` with its top-left corner at (x, y), each font pixel a scale × scale square;
  /// returns the x just past the last glyph.
  int text(int x, int y, std::string_view s, Rgb c, int scale = 2) {
    for (char ch : s) {
      const std::uint16_t g = font::glyph_of(ch);
      for (int row = 0; row < font::kHeight; ++row)
        for (int col = 0; col < font::kWidth; ++col)
          if (g >> ((font::kHeight - 1 - row) * font::kWidth + (font::kWidth - 1 - col)) & 1)
            fill(x + col * scale, y + row * scale, scale, scale, c);
      x += text_advance(scale);
    }
    return x;
  }

  static constexpr int text_advance(int scale = 2) { return (font::kWidth + 1) * scale; }
  static constexpr int text_width(std::string_view s, int scale = 2) {
    return static_cast<int>(s.size()) * text_advance(scale);
  }
};

}  // namespace kvpolicy::replay
