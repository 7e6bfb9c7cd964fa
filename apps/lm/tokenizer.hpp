// kvpolicy-lm's tokenizer: byte-level BPE (GPT-2's scheme) with llama.cpp's "smollm" pre-tokenizer,
// so that a text gives the token ids llama.cpp gives (tests/lm checks it against llama.cpp's own).
//   1. the text's code points are cut so that every number (\p{N}) stands alone;
//   2. each piece is split by 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      as llama.cpp's hand-written GPT-2 splitter does it (the lookahead stops at the piece's end);
//   3. each word's UTF-8 bytes become GPT-2's printable stand-ins, and the merges apply, lowest rank
//      first (leftmost on ties), until none applies; each symbol is then a vocabulary token.
// The vocabulary, merges and code point classes come from tokenizer.json (kvpolicy-gguf-to-lm).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvpolicy/core/error.hpp"

namespace kvpolicy::lm {

namespace utf8 {

/// The code points of a UTF-8 string; an ill-formed sequence is an error naming its byte offset.
inline std::vector<std::uint32_t> decode(const std::string& s) {
  std::vector<std::uint32_t> out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    int n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    require(n != 0 && i + static_cast<std::size_t>(n) <= s.size(), "tokenizer: the text is not valid UTF-8 at byte ", i);
    std::uint32_t cp = n == 1 ? b : b & (0x7Fu >> n);
    for (int k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      require((c & 0xC0) == 0x80, "tokenizer: the text is not valid UTF-8 at byte ", i + static_cast<std::size_t>(k));
      cp = (cp << 6) | (c & 0x3F);
    }
    const std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    require(cp >= least[n] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF), "tokenizer: the text is not valid UTF-8 at byte ", i);
    out.push_back(cp);
    i += static_cast<std::size_t>(n);
  }
  return out;
}

inline void append(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace utf8

class Tokenizer {
 public:
  static Tokenizer load(const std::string& path) {
    std::ifstream in(path);
    require(in.good(), "tokenizer: cannot open '", path, "'");
    Tokenizer t;
    try {
      const auto j = nlohmann::json::parse(in);
      require(j.at("model") == "gpt2" && j.at("pre") == "smollm", "tokenizer: '", path,
              "' is not a byte-level BPE with the smollm pre-tokenizer");
      t.tokens_ = j.at("tokens").get<std::vector<std::string>>();
      t.types_ = j.at("token_type").get<std::vector<int>>();
      const auto merges = j.at("merges").get<std::vector<std::string>>();
      t.letters_ = j.at("letters").get<std::vector<std::array<std::uint32_t, 2>>>();
      t.numbers_ = j.at("numbers").get<std::vector<std::array<std::uint32_t, 2>>>();
      t.whitespace_ = j.at("whitespace").get<std::vector<std::array<std::uint32_t, 2>>>();
      require(t.types_.size() == t.tokens_.size(), "tokenizer: '", path, "': ", t.types_.size(), " token types for ",
              t.tokens_.size(), " tokens");
      for (std::size_t i = 0; i < t.tokens_.size(); ++i) {
        require(t.ids_.emplace(t.tokens_[i], static_cast<int>(i)).second, "tokenizer: '", path, "': token ", i,
                " repeats an earlier token's text");
      }
      for (std::size_t r = 0; r < merges.size(); ++r) {
        const auto space = merges[r].find(' ');
        require(space != std::string::npos && space > 0 && space + 1 < merges[r].size(), "tokenizer: '", path,
                "': merge ", r, " ('", merges[r], "') is not 'left right'");
        t.ranks_.emplace(merges[r], static_cast<int>(r));
      }
    } catch (const nlohmann::json::exception& e) {
      fail("tokenizer: '", path, "': ", e.what());
    }
    // GPT-2's byte stand-ins: printable Latin-1 bytes stand for themselves, the others for 256 + k.
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const std::uint32_t cp = printable ? static_cast<std::uint32_t>(b) : static_cast<std::uint32_t>(next++);
      t.byte_to_cp_[static_cast<std::size_t>(b)] = cp;
      t.cp_to_byte_.emplace(cp, static_cast<std::uint8_t>(b));
    }
    return t;
  }

  int vocab_size() const { return static_cast<int>(tokens_.size()); }

  std::vector<int> encode(const std::string& text) const {
    std::vector<int> out;
    const auto cps = utf8::decode(text);
    // 1. every number on its own (the pre-tokenizer's first expression, \p{N})
    std::size_t start = 0;
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (i == cps.size() || is_number(cps[i])) {
        split_words(cps, start, i, out);
        if (i < cps.size()) split_words(cps, i, i + 1, out);
        start = i + 1;
      }
    }
    return out;
  }

  /// The bytes a token stands for (control tokens: their text).
  std::string decode(int id) const {
    require(id >= 0 && id < vocab_size(), "tokenizer: token id ", id, " is not in [0, ", vocab_size(), ")");
    const std::string& text = tokens_[static_cast<std::size_t>(id)];
    if (types_[static_cast<std::size_t>(id)] != 1) return text;  // 1 = normal; control/user tokens print as written
    std::string out;
    for (std::uint32_t cp : utf8::decode(text)) {
      auto it = cp_to_byte_.find(cp);
      if (it == cp_to_byte_.end()) {
        utf8::append(out, cp);
      } else {
        out += static_cast<char>(it->second);
      }
    }
    return out;
  }

  std::string decode(const std::vector<int>& ids) const {
    std::string out;
    for (int id : ids) out += decode(id);
    return out;
  }

 private:
  static bool in(const std::vector<std::array<std::uint32_t, 2>>& ranges, std::uint32_t cp) {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                               [](std::uint32_t v, const std::array<std::uint32_t, 2>& r) { return v < r[0]; });
    return it != ranges.begin() && cp <= (*(it - 1))[1];
  }
  bool is_letter(std::uint32_t cp) const { return in(letters_, cp); }
  bool is_number(std::uint32_t cp) const { return in(numbers_, cp); }
  bool is_space(std::uint32_t cp) const { return in(whitespace_, cp); }

  // 2. llama.cpp's GPT-2 splitter over cps[begin, end); positions past `end` match nothing.
  void split_words(const std::vector<std::uint32_t>& cps, std::size_t begin, std::size_t end, std::vector<int>& out) const {
    constexpr std::uint32_t kNone = 0xFFFFFFFF;
    auto at = [&](std::size_t p) { return p < end ? cps[p] : kNone; };
    auto letter = [&](std::size_t p) { return p < end && is_letter(cps[p]); };
    auto number = [&](std::size_t p) { return p < end && is_number(cps[p]); };
    auto space = [&](std::size_t p) { return p < end && is_space(cps[p]); };
    auto other = [&](std::size_t p) { return p < end && !is_space(cps[p]) && !is_letter(cps[p]) && !is_number(cps[p]); };
    std::size_t pos = begin;
    auto emit = [&](std::size_t to) {
      if (to > pos) bpe(cps, pos, to, out);
      pos = to;
    };
    while (pos < end) {
      const std::uint32_t c = cps[pos];
      if (c == '\'' && pos + 1 < end) {  // 's|'t|'re|'ve|'m|'ll|'d
        const std::uint32_t n1 = at(pos + 1), n2 = at(pos + 2);
        if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
          emit(pos + 2);
          continue;
        }
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          emit(pos + 3);
          continue;
        }
      }
      const std::size_t q = c == ' ' ? pos + 1 : pos;  // the optional leading space
      if (letter(q) || number(q) || other(q)) {         // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
        const auto same = letter(q) ? +[](const Tokenizer& t, std::uint32_t x) { return t.is_letter(x); }
                          : number(q) ? +[](const Tokenizer& t, std::uint32_t x) { return t.is_number(x); }
                                      : +[](const Tokenizer& t, std::uint32_t x) {
                                          return !t.is_space(x) && !t.is_letter(x) && !t.is_number(x);
                                        };
        std::size_t e = q;
        while (e < end && same(*this, cps[e])) ++e;
        emit(e);
        continue;
      }
      std::size_t spaces = 0;
      while (space(pos + spaces)) ++spaces;
      if (spaces > 1 && at(pos + spaces) != kNone) {  // '\s+(?!\S)': leave the last space to the next word
        emit(pos + spaces - 1);
        continue;
      }
      emit(pos + (spaces > 0 ? spaces : 1));  // '\s+', or one unmatched code point
    }
  }

  // 3. byte-level BPE of one word
  void bpe(const std::vector<std::uint32_t>& cps, std::size_t begin, std::size_t end, std::vector<int>& out) const {
    std::string bytes;
    for (std::size_t i = begin; i < end; ++i) utf8::append(bytes, cps[i]);
    std::vector<std::string> sym;
    sym.reserve(bytes.size());
    for (unsigned char b : bytes) {
      std::string s;
      utf8::append(s, byte_to_cp_[b]);
      sym.push_back(std::move(s));
    }
    while (sym.size() > 1) {
      int best = -1;
      std::size_t where = 0;
      for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = ranks_.find(sym[i] + " " + sym[i + 1]);
        if (it != ranks_.end() && (best < 0 || it->second < best)) {  // lowest rank, leftmost on ties
          best = it->second;
          where = i;
        }
      }
      if (best < 0) break;
      sym[where] += sym[where + 1];
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(where) + 1);
    }
    for (const auto& s : sym) {
      auto it = ids_.find(s);
      if (it != ids_.end()) {
        out.push_back(it->second);
        continue;
      }
      for (char b : s) {  // as llama.cpp: a symbol outside the vocabulary falls back to its bytes' tokens
        auto one = ids_.find(std::string(1, b));
        if (one != ids_.end()) out.push_back(one->second);
      }
    }
  }

  std::vector<std::string> tokens_;
  std::vector<int> types_;
  std::unordered_map<std::string, int> ids_;
  std::unordered_map<std::string, int> ranks_;
  std::vector<std::array<std::uint32_t, 2>> letters_, numbers_, whitespace_;
  std::array<std::uint32_t, 256> byte_to_cp_{};
  std::unordered_map<std::uint32_t, std::uint8_t> cp_to_byte_;
};

}  // namespace kvpolicy::lm
