// CTA sizes of the combine kernel.
#pragma once

namespace mla::sm90::combine {

inline constexpr int kCombineMaxThreads = 512;
inline constexpr int kCombineBatch = 8;  // o vectors in flight per thread
inline constexpr int kCombineL = 512;
inline constexpr int kCombineMaxRows = 4;  // rows per item (consecutive heads of one token)

}  // namespace mla::sm90::combine
