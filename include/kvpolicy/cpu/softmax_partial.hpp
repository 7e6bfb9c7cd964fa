/// \file
/// kvpolicy/cpu/softmax_partial.hpp — the state flash-decoding passes between its two halves (SPEC §6
/// computed in parts): the online softmax of a few query rows over one range of a head's entries
/// (cpu::attend_tiled_partial), before the ranges of the head are merged (cpu::merge_softmax_partials).
#pragma once

namespace kvpolicy::cpu {

/// The online softmax's state of `rows` query rows over part of a head's entries: the running max
/// m[rows], the sum l[rows] of e^(s - m), and acc[rows, d] = Σ e^(s - m)·v, not yet divided by l. A
/// row that saw no key has m = -inf, l = 0, acc = 0.
struct SoftmaxPartial {
  float* m;
  float* l;
  float* acc;
};

}  // namespace kvpolicy::cpu
