// CTA sizes of the combine kernel.
#pragma once

namespace mla::sm90::combine {

inline constexpr int kCombineMaxThreads = 512;
inline constexpr int kCombineBatch = 8;  // o vectors in flight per thread
inline constexpr int kCombineL = 512;
inline constexpr int kCombineMaxRows = 4;  // rows per item (consecutive heads of one token)
// The row kernel (one warp per row) takes calls whose rows have at most this many splits (the
// typical count, DecodeKernelParams::num_splits).
inline constexpr int kRowsMaxSplits = 8;

}  // namespace mla::sm90::combine
