// kvpolicy-replay's heatmaps (apps/replay/heatmap.hpp): the map is the TRIM-KV paper's Figure 4,
// and the legend under it names the colours and the axes, so a PNG explains itself.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "heatmap.hpp"

using namespace kvpolicy;
using namespace kvpolicy::replay;

namespace {

// One layer, one kv head, 40 tokens; token 3 is evicted when 10 tokens have been processed.
Trace tiny_trace() {
  Trace tr;
  tr.layers = 1;
  tr.kv_heads = 1;
  tr.q_heads = 1;
  tr.head_dim = 4;
  tr.tokens = 40;
  for (std::int64_t p = 0; p < tr.tokens; ++p) tr.log_beta.push_back(std::log(0.5f + 0.01f * static_cast<float>(p)));
  return tr;
}

int ink_pixels(const Image& img, int y0, int y1) {
  int n = 0;
  for (int y = y0; y < y1; ++y)
    for (int x = 0; x < img.width; ++x) n += img.at(x, y) == HeatmapColors::ink;
  return n;
}

}  // namespace

TEST_CASE("legend font: a glyph is drawn bit for bit, and a character it lacks is an error naming it") {
  Image img(4, 5, HeatmapColors::white);
  img.text(0, 0, "1", HeatmapColors::ink, /*scale=*/1);
  const char* want[5] = {".#.", "##.", ".#.", ".#.", "###"};
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 3; ++x)
      CHECK_MESSAGE((img.at(x, y) == HeatmapColors::ink) == (want[y][x] == '#'), "pixel ", x, ",", y);
  for (int y = 0; y < 5; ++y) CHECK(img.at(3, y) == HeatmapColors::white);  // the gap between glyphs
  for (char c : std::string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcxyz0123456789 .,:-=^()/")) CHECK_NOTHROW(font::glyph_of(c));
  CHECK_THROWS_WITH_AS(font::glyph_of('#'), "kvpolicy: replay: the legend font has no glyph for '#'", Error);
}

TEST_CASE("heatmaps: the map is beta_p^(t-p) and kept/evicted per step, with a legend under it") {
  const Trace tr = tiny_trace();
  std::vector<std::int64_t> evicted_at(40, -1);
  evicted_at[3] = 10;
  using C = HeatmapColors;
  using L = HeatmapLegend;
  const Image ret = render_heatmap(HeatmapKind::retention, tr, evicted_at, 0, 0);
  const Image dec = render_heatmap(HeatmapKind::decisions, tr, evicted_at, 0, 0);
  const int side = 40;
  for (const Image* img : {&ret, &dec}) {
    CHECK(img->height == side + L::kBand);
    CHECK(img->width >= 2 * L::kPad + Image::text_width(L::kAxes));
    CHECK(img->at(30, 5) == C::white);  // p > t: not yet written
    // each of the legend's three lines has text
    for (int line = 0; line < 3; ++line)
      CHECK(ink_pixels(*img, side + L::kPad + line * L::kLine, side + L::kPad + line * L::kLine + 10) > 20);
    // nothing of the legend reaches into the map
    CHECK(ink_pixels(*img, 0, side) == 0);
  }
  // retention: row t, column p is beta_p^(t - p) from white to blue
  for (int t : {0, 7, 39})
    for (int p : {0, 3, 7})
      if (p <= t) CHECK(ret.at(p, t) == blend(C::white, C::blue, std::exp(tr.lb(0, 0, p) * static_cast<float>(t - p))));
  // decisions: token 3 is kept while n = t + 1 < 10 tokens are processed, evicted from step t = 9 on
  CHECK(dec.at(3, 8) == C::blue);
  CHECK(dec.at(3, 9) == C::orange);
  CHECK(dec.at(3, 39) == C::orange);
  CHECK(dec.at(4, 39) == C::blue);
  // the retention key: a gradient from white (0) to blue (1), left to right
  const int key_y = side + L::kPad + L::kLine + L::kSwatch / 2, key_x = L::kPad + Image::text_width("0 ");
  CHECK(ret.at(key_x, key_y) == C::white);
  CHECK(ret.at(key_x + L::kGradient - 1, key_y) == C::blue);
  for (int i = 1; i < L::kGradient; ++i) CHECK(ret.at(key_x + i, key_y).r <= ret.at(key_x + i - 1, key_y).r);
  // the decisions key: blue, orange and white swatches, in that order
  const int sw_y = side + L::kPad + L::kLine + L::kSwatch / 2;
  int x = L::kPad + L::kSwatch / 2;
  CHECK(dec.at(x, sw_y) == C::blue);
  x += L::kSwatch + Image::text_width(" KEPT  ");
  CHECK(dec.at(x, sw_y) == C::orange);
  x += L::kSwatch + Image::text_width(" EVICTED  ");
  CHECK(dec.at(x, sw_y) == C::white);
}

TEST_CASE("heatmaps: a long trace is downsampled to max_side, the legend below the smaller map") {
  Trace tr = tiny_trace();
  std::vector<std::int64_t> evicted_at(40, -1);
  const Image img = render_heatmap(HeatmapKind::decisions, tr, evicted_at, 0, 0, /*max_side=*/16);
  CHECK(img.height == 16 + HeatmapLegend::kBand);
  CHECK(img.at(15, 15) == HeatmapColors::blue);  // the last step sees the last token, kept
  CHECK(img.at(15, 0) == HeatmapColors::white);
  CHECK(ink_pixels(img, 0, 16) == 0);
  CHECK(ink_pixels(img, 16 + HeatmapLegend::kPad, 16 + HeatmapLegend::kPad + 10) > 20);
}
