// Heatmaps of a replay, like the TRIM-KV paper's Figure 4: for one (layer, kv head), rows are the
// decode steps t, columns the token positions p <= t.
//   retention: beta_p^(t - p), from white (0) to dark blue (1);
//   decisions: kept (dark blue), evicted (orange), not yet generated (white).
// Large traces are downsampled to at most `max_side` pixels a side (nearest sample).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <stb_image_write.h>

#include "kvpolicy/core/error.hpp"
#include "trace.hpp"

namespace kvpolicy::replay {

struct Rgb {
  std::uint8_t r, g, b;
};

inline void write_png(const std::string& path, int w, int h, const std::vector<Rgb>& px) {
  require(stbi_write_png(path.c_str(), w, h, 3, px.data(), w * 3) != 0, "replay: cannot write '", path, "'");
}

inline Rgb blend(Rgb a, Rgb b, float x) {
  auto mix = [x](std::uint8_t u, std::uint8_t v) { return static_cast<std::uint8_t>(std::lround(u + (v - u) * x)); };
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

// Writes DIR/retention_l{l}_h{h}.png and DIR/decisions_l{l}_h{h}.png.
inline void write_heatmaps(const std::string& dir, const Trace& tr, const std::vector<std::int64_t>& evicted_at, int l, int h,
                           int max_side = 768) {
  const std::int64_t T = tr.tokens;
  const int side = static_cast<int>(std::min<std::int64_t>(T, max_side));
  const Rgb white{255, 255, 255}, blue{8, 48, 107}, orange{230, 120, 20};
  std::vector<Rgb> retention(static_cast<std::size_t>(side * side), white), decisions(retention.size(), white);
  for (int y = 0; y < side; ++y) {
    const std::int64_t t = y * T / side;
    for (int x = 0; x < side; ++x) {
      const std::int64_t p = x * T / side;
      if (p > t) continue;
      const auto i = static_cast<std::size_t>(y * side + x);
      retention[i] = blend(white, blue, std::exp(tr.lb(l, h, p) * static_cast<float>(t - p)));
      // after step t (n = t + 1 tokens processed) token p is present iff never evicted or evicted later
      const std::int64_t e = evicted_at[static_cast<std::size_t>((l * tr.kv_heads + h) * T + p)];
      decisions[i] = (e == -1 || e > t + 1) ? blue : orange;
    }
  }
  const std::string tag = "_l" + std::to_string(l) + "_h" + std::to_string(h) + ".png";
  write_png(dir + "/retention" + tag, side, side, retention);
  write_png(dir + "/decisions" + tag, side, side, decisions);
}

}  // namespace kvpolicy::replay
