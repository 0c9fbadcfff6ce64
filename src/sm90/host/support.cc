// The limits of the sm90 backend (limits.h), checked on the host in every build.
#include "host/backends.h"
#include "host/check.h"
#include "sm90/host/limits.h"

namespace mla::detail::sm90 {

void check_support(const Problem& p) {
  MLA_CHECK_ARG(head_dims_supported(p.L, p.R), ErrorCode::kUnsupported,
                "kv_lora_rank/qk_rope_head_dim: backend sm90 supports (kv_lora_rank, "
                "qk_rope_head_dim) = (512, 64), (256, 64) or (512, 0), got ("
                    << p.L << ", " << p.R << ")");
  MLA_CHECK_ARG(p.num_heads <= kMaxHeads, ErrorCode::kUnsupported,
                "query: backend sm90 supports 1 to " << kMaxHeads << " heads, got " << p.num_heads);
  MLA_CHECK_ARG(p.page_size <= kMaxPageSize, ErrorCode::kUnsupported,
                "kv_cache: backend sm90 supports page_size up to " << kMaxPageSize << ", got "
                                                                   << p.page_size);
  MLA_CHECK_ARG(p.ragged || p.q_len <= kMaxDenseQLen, ErrorCode::kUnsupported,
                "query: backend sm90 supports q_len up to "
                    << kMaxDenseQLen << " for dense queries, got " << p.q_len);
}

}  // namespace mla::detail::sm90
