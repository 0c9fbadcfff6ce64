// Host-side entry points shared by the API layer and the backends.
#pragma once

#include <cstddef>

#include "host/problem.h"
#include "mla/decode.h"

namespace mla::detail {

// Checks every SPEC.md section 5 rule that needs no look at device memory and derives the Problem.
// Throws mla::Error before anything is launched or written. Does not check the workspace size.
Problem validate(const DecodeParams& params);

namespace cpu {

// Bytes of host workspace the cpu backend needs for `problem`.
size_t workspace_size(const Problem& problem);

// Checks the contents of block_tables, seq_lens, cum_seq_lens_q, sparse_indices and
// sparse_topk_lens; throws mla::Error (BadIndex) naming the first bad entry.
void check_indices(const Problem& problem, const DecodeParams& params);

// Computes out (and lse). Calls check_indices first, so nothing is written for bad indices.
void run(const Problem& problem, const DecodeParams& params);

}  // namespace cpu
}  // namespace mla::detail
