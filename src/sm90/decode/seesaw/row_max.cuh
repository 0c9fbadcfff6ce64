// The seesaw kernels' row max of an unmasked block (shared by the 16-bit and FP8 seesaw kernels).
#pragma once

#include <cute/tensor.hpp>

#include "sm90/common.cuh"

namespace mla::sm90::seesaw {

// A thread's two rows of an unmasked block of scores `s` (an m64 accumulator fragment: value v
// belongs to row slot (v >> 1) & 1): their largest scores into block_max, and neg_inf[slot] set
// where the row holds an attended score of -inf (its row then turns NaN, contract section 1.2).
// NOTE: one largest |s| over both rows finds the rare block that holds an infinity; a flag per
// score cost the hot shapes 2 to 4%.
template <typename Frag>
__device__ __forceinline__ void unmasked_block_max(const Frag& s, float (&block_max)[2],
                                                   bool (&neg_inf)[2]) {
  float abs_max = 0.0f;
  CUTE_UNROLL
  for (int v = 0; v < cute::size(s); ++v) {
    block_max[(v >> 1) & 1] = fmaxf(block_max[(v >> 1) & 1], s(v));
    abs_max = fmaxf(abs_max, fabsf(s(v)));
  }
  if (abs_max == kInf) {
    CUTE_UNROLL
    for (int v = 0; v < cute::size(s); ++v) {
      neg_inf[(v >> 1) & 1] = neg_inf[(v >> 1) & 1] || s(v) == kNegInf;
    }
  }
}

// The same where the scores cannot be infinite (an e4m3 query over an e4m3 cache: e4m3 has no inf
// and |s| <= 576 x 448^2 < 2^27 before the scale is applied): the maxima alone; a NaN score still
// turns its row NaN through P.
template <typename Frag>
__device__ __forceinline__ void finite_block_max(const Frag& s, float (&block_max)[2]) {
  CUTE_UNROLL
  for (int v = 0; v < cute::size(s); ++v) {
    block_max[(v >> 1) & 1] = fmaxf(block_max[(v >> 1) & 1], s(v));
  }
}

}  // namespace mla::sm90::seesaw
