// Tile sizes and the shared-memory plan of the SIMT decode kernel.
#pragma once

#include <cstddef>

#include "sm90/decode/simt/launch.h"
#include "sm90/params.h"

namespace mla::sm90::simt {

// L, R: the head dims (kv_lora_rank, qk_rope_head_dim); (512, 64) is DeepSeek's and the only
// pair with split partials (the combine's row width); (256, 64) and (512, 0) run one split.
template <int L = 512, int R = 64>
struct SimtTraits {
  static constexpr int kThreads = 256;         // 8 warps
  static constexpr int kHeads = kHeadsPerCta;  // query heads of one token per CTA
  static constexpr int kKeys = kBlockKeys;     // keys per block
  static constexpr int kD = L + R;             // key width
  static constexpr int kL = L;                 // value width
  static_assert(kD % 4 == 0, "the score loop reads float4");
  // NOTE: rows padded by 4 floats (580 for D 576): float4 reads of 32 different rows hit distinct
  // banks.
  static constexpr int kRowPitch = kD + 4;
  // Output columns 2 tid and 2 tid + 1: threads with 2 tid >= L hold none.
  static constexpr int kColsPerThread = 2;
  static_assert(kL <= 2 * kThreads && kL % 2 == 0, "the PV loop's float2 columns");
  static_assert(kThreads == 4 * kKeys, "the score loop assumes 4 threads per key");

  struct SharedMemoryPlan {
    float q[kHeads][kRowPitch];   // the token's query rows, fp32
    float k[kKeys][kRowPitch];    // the block's key rows, fp32 (0 for keys not attended)
    float s[kHeads][kKeys];       // scores bmm1_scale * q.k, -inf for keys not attended
    float p[kKeys][kHeads];       // exp(s - new max), transposed for the PV loop
    float row_max[kHeads];        // running max of this split (-inf: no key yet)
    float row_sum[kHeads];        // running sum of exp(s - row_max)
    float rescale[kHeads];        // exp(old max - new max) of the current block
    int negligible[kHeads];       // skip-softmax vote of each head for the current block
    long long row_offset[kKeys];  // element offset of each key's cache row; -1: not attended
  };
  static_assert(sizeof(SharedMemoryPlan) <= 227 * 1024, "shared memory budget of one sm90 CTA");
};

}  // namespace mla::sm90::simt
