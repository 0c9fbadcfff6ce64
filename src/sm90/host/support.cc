// The limits of the sm90 backend, checked on the host in every build.
#include "host/backends.h"
#include "host/check.h"

namespace mla::detail::sm90 {

namespace {
constexpr int64_t kMaxHeads = 128;
constexpr int64_t kMaxPageSize = 256;
constexpr int64_t kMaxDenseQLen = 16;
}  // namespace

void check_support(const Problem& p) {
  MLA_CHECK_ARG(p.L == 512 && p.R == 64, ErrorCode::kUnsupported,
                "kv_lora_rank/qk_rope_head_dim: backend sm90 supports kv_lora_rank 512 with "
                "qk_rope_head_dim 64 (D 576) only, got kv_lora_rank "
                    << p.L << " and qk_rope_head_dim " << p.R);
  MLA_CHECK_ARG(p.num_heads <= kMaxHeads, ErrorCode::kUnsupported,
                "query: backend sm90 supports 1 to " << kMaxHeads << " heads, got " << p.num_heads);
  MLA_CHECK_ARG(p.page_size <= kMaxPageSize, ErrorCode::kUnsupported,
                "kv_cache: backend sm90 supports page_size up to " << kMaxPageSize << ", got "
                                                                   << p.page_size);
  // Ragged queries: any per-request length (each CTA of the v0 kernel handles one token).
  MLA_CHECK_ARG(p.ragged || p.q_len <= kMaxDenseQLen, ErrorCode::kUnsupported,
                "query: backend sm90 supports q_len up to "
                    << kMaxDenseQLen << " for dense queries, got " << p.q_len);
}

}  // namespace mla::detail::sm90
