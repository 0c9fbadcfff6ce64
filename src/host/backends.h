// Host-side entry points shared by the API layer and the backends.
#pragma once

#include <cstddef>
#include <cstdint>

#include "host/merge_problem.h"
#include "host/problem.h"
#include "mla/decode.h"
#include "mla/exchange.h"

namespace mla::detail {

// The peer exchange's buffer after its N slots (include/mla/exchange.h,
// src/sm90/exchange/launch.h): a landing area of kPeerExchangeLandingSlots x N slots (each rank's
// slot as 16-byte lines of 8 bytes and two step words, for either step parity), then one 32-bit
// step counter per CTA (64).
inline constexpr int64_t kPeerExchangeLandingSlots = 4;
inline constexpr int64_t kPeerExchangeControlBytes = 64 * 4;

// Checks every docs/contract.md section 5 rule that needs no look at device memory and derives the
// Problem. Throws mla::Error before anything is launched or written. Does not check the workspace
// size.
Problem validate(const DecodeParams& params);

namespace cpu {

// Bytes of host workspace the cpu backend needs for `problem`.
size_t workspace_size(const Problem& problem);

// Checks the contents of block_tables, seq_lens, cum_seq_lens_q, sparse_indices and
// sparse_topk_lens; throws mla::Error (BadIndex) naming the first bad entry.
void check_indices(const Problem& problem, const DecodeParams& params);

// Computes out (and lse). Calls check_indices first, so nothing is written for bad indices.
void run(const Problem& problem, const DecodeParams& params);

// Merges the partial states of a validated merge call (src/cpu/merge.cc).
void merge_states(const MergeProblem& problem, const MergeParams& params);

}  // namespace cpu

// The Hopper GPU backend (src/sm90/). A build without CUDA (MLA_ENABLE_CUDA=OFF) links stubs that
// reject it with an error saying so.
namespace sm90 {

// Throws mla::Error (Unsupported) unless `device` is a CUDA device of compute capability 9.0
// (no CUDA device or driver, another architecture, or a build without CUDA).
void check_device(Device device);

// Checks this backend's limits (head dims, heads, page size, query length); throws Unsupported.
void check_support(const Problem& problem);

// Bytes of device workspace: the checked mode's record, the split partials and the balanced
// schedule (src/sm90/host/route.h, Layout). Depends on the shapes and on the device's SM count
// (which fixes the split count), never on tensor contents.
size_t workspace_size(const Problem& problem);

// Writes what the call's route needs before run: the balanced schedule of the seesaw and few-rows
// kernels, by a plan kernel on params.stream, where the route runs it (src/sm90/host/route.h);
// nothing otherwise (the other routes derive each CTA's key range from seq_lens on the device).
void plan(const Problem& problem, const DecodeParams& params);

// Launches the decode (and, with validate_indices, the index check first) on params.stream.
void run(const Problem& problem, const DecodeParams& params);

// Launches the merge kernel on params.stream (src/sm90/host/merge.cc; a build without CUDA links
// src/sm90/host/merge_unavailable.cc).
void merge_states(const MergeProblem& problem, const MergeParams& params);

// Launches the peer exchange kernel of validated params on params.stream
// (src/sm90/host/exchange.cc; a build without CUDA links the stub in
// src/sm90/host/merge_unavailable.cc).
void peer_exchange(const PeerExchangeParams& params);

}  // namespace sm90
}  // namespace mla::detail
