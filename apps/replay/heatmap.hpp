// Heatmaps of a replay, like the TRIM-KV paper's Figure 4: for one (layer, kv head), rows are the
// decode steps t, columns the token positions p <= t.
//   retention: beta_p^(t - p), from white (0) to dark blue (1);
//   decisions: kept (dark blue), evicted (orange), not yet generated (white).
// Large traces are downsampled to at most `max_side` pixels a side (nearest sample). Below the map,
// a legend says what the colours and the axes are (legend.hpp), so a PNG explains itself.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <stb_image_write.h>

#include "kvpolicy/core/error.hpp"
#include "legend.hpp"
#include "trace.hpp"

namespace kvpolicy::replay {

inline void write_png(const std::string& path, const Image& image) {
  require(stbi_write_png(path.c_str(), image.width, image.height, 3, image.px.data(), image.width * 3) != 0,
          "replay: cannot write '", path, "'");
}

inline Rgb blend(Rgb a, Rgb b, float x) {
  auto mix = [x](std::uint8_t u, std::uint8_t v) { return static_cast<std::uint8_t>(std::lround(u + (v - u) * x)); };
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

struct HeatmapColors {
  static constexpr Rgb white{255, 255, 255}, blue{8, 48, 107}, orange{230, 120, 20}, ink{40, 40, 40};
};

/// The legend's geometry: three lines of text under the map.
struct HeatmapLegend {
  static constexpr int kPad = 6, kLine = 14, kBand = kPad + 3 * kLine, kSwatch = 10, kGradient = 128;
  static inline const std::string kAxes = "ROW T: DECODE STEP, COLUMN P: TOKEN";
};

enum class HeatmapKind { retention, decisions };

/// One heatmap and its legend, as an image: the map in the top-left side × side square, the legend
/// in the band below it.
inline Image render_heatmap(HeatmapKind kind, const Trace& tr, const std::vector<std::int64_t>& evicted_at, int l,
                            int h, int max_side = 768) {
  using C = HeatmapColors;
  using L = HeatmapLegend;
  const std::int64_t T = tr.tokens;
  const int side = static_cast<int>(std::min<std::int64_t>(T, max_side));
  const std::string where =
      "LAYER " + std::to_string(l) + ", KV HEAD " + std::to_string(h) + ", TOKENS 0-" + std::to_string(T - 1);
  const int key_width = kind == HeatmapKind::retention
                            ? Image::text_width("0 ") + L::kGradient + Image::text_width(" 1  BETA^(T-P)")
                            : 3 * L::kSwatch + Image::text_width(" KEPT   EVICTED   NOT YET WRITTEN");
  const int width = std::max({side, 2 * L::kPad + key_width, 2 * L::kPad + Image::text_width(where),
                              2 * L::kPad + Image::text_width(L::kAxes)});
  Image img(width, side + L::kBand, C::white);
  for (int y = 0; y < side; ++y) {
    const std::int64_t t = y * T / side;
    for (int x = 0; x < side; ++x) {
      const std::int64_t p = x * T / side;
      if (p > t) continue;
      if (kind == HeatmapKind::retention) {
        img.at(x, y) = blend(C::white, C::blue, std::exp(tr.lb(l, h, p) * static_cast<float>(t - p)));
      } else {
        // after step t (n = t + 1 tokens processed) token p is present iff never evicted or evicted later
        const std::int64_t e = evicted_at[static_cast<std::size_t>((l * tr.kv_heads + h) * T + p)];
        img.at(x, y) = (e == -1 || e > t + 1) ? C::blue : C::orange;
      }
    }
  }
  int y = side + L::kPad, x = L::kPad;
  img.text(x, y, where, C::ink);
  y += L::kLine;
  if (kind == HeatmapKind::retention) {
    x = img.text(x, y, "0 ", C::ink);
    for (int i = 0; i < L::kGradient; ++i)
      img.fill(x + i, y, 1, L::kSwatch, blend(C::white, C::blue, static_cast<float>(i) / (L::kGradient - 1)));
    img.outline(x - 1, y - 1, L::kGradient + 2, L::kSwatch + 2, C::ink);
    img.text(x + L::kGradient, y, " 1  BETA^(T-P)", C::ink);
  } else {
    const auto swatch = [&](Rgb c, const char* label) {
      img.fill(x, y, L::kSwatch, L::kSwatch, c);
      img.outline(x, y, L::kSwatch, L::kSwatch, C::ink);
      x = img.text(x + L::kSwatch, y, label, C::ink);
    };
    swatch(C::blue, " KEPT  ");
    swatch(C::orange, " EVICTED  ");
    swatch(C::white, " NOT YET WRITTEN");
  }
  img.text(L::kPad, y + L::kLine, L::kAxes, C::ink);
  return img;
}

// Writes DIR/retention_l{l}_h{h}.png and DIR/decisions_l{l}_h{h}.png.
inline void write_heatmaps(const std::string& dir, const Trace& tr, const std::vector<std::int64_t>& evicted_at, int l, int h,
                           int max_side = 768) {
  const std::string tag = "_l" + std::to_string(l) + "_h" + std::to_string(h) + ".png";
  write_png(dir + "/retention" + tag, render_heatmap(HeatmapKind::retention, tr, evicted_at, l, h, max_side));
  write_png(dir + "/decisions" + tag, render_heatmap(HeatmapKind::decisions, tr, evicted_at, l, h, max_side));
}

}  // namespace kvpolicy::replay
