// The limits of the sm90 backend, each stated once: what it supports at all (checked by
// check_support() in support.cc, in every build) and what its TMA kernels take (route.cc).
#pragma once

#include <cstdint>

namespace mla::detail::sm90 {

// Head dims: kv_lora_rank 512 with qk_rope_head_dim 64 (D 576), DeepSeek's, on every kernel; the
// other pairs FlashInfer's API takes, (256, 64) and (512, 0), on the SIMT kernel in one split.
inline constexpr int64_t kKvLoraRank = 512;
inline constexpr int64_t kRopeHeadDim = 64;
inline bool head_dims_supported(int64_t L, int64_t R) {
  return (L == 512 && R == 64) || (L == 256 && R == 64) || (L == 512 && R == 0);
}
inline constexpr int64_t kMaxHeads = 128;
inline constexpr int64_t kMaxPageSize = 256;
// Dense queries; ragged ones take any per-request length (the SIMT kernel runs one CTA per
// token).
inline constexpr int64_t kMaxDenseQLen = 16;

// The TMA kernels (few_rows/, seesaw/) load K blocks in TMA boxes of min(64, page_size) rows:
// pages of at least this many keys. Smaller pages run on the SIMT kernel.
inline constexpr int64_t kMinTmaPageSize = 16;

}  // namespace mla::detail::sm90
