// Host-side entry points of the seesaw decode kernel; definitions in seesaw_<e>.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::seesaw {

// The (query, kv_cache) pairs with an evict-first instantiation: a 16-bit cache of the query's
// type, the only calls its gains were measured on (docs/perf-notes.md, Changes 85 and 87).
__host__ __device__ constexpr bool has_evict_first(Elem q, Elem kv) {
  return q == kv && (q == Elem::kBf16 || q == Elem::kFp16);
}

// The fewest of top_k's blocks a split of an unpaired sparse call over fp8_ds_mla rows has for its
// rows to be loaded a block ahead (seesaw_kernel.cuh, kAheadUnpaired); splits of fewer run on the
// landing path (kShortSplits, the route's short_splits). Since Changes 102 and 104 the rows-ahead
// path is faster from 4 blocks a split up (B16 H64 -8%, B32 -18%) and slower at 1 and 2 (+9%,
// +6%; docs/perf-notes.md, Change 110; Change 99 had set 16).
inline constexpr int kAheadMinBlocks = 3;

// Computes the partials of every (split, token, head) in tiles of 64 query rows, or, for a request
// of one segment (one split), its out and lse; one explicit instantiation per supported (query,
// kv_cache) pair: (bf16, bf16), (fp16, fp16), (bf16, e4m3) and (e4m3, e4m3) (tma::Formats). Grid
// (num_tiles, params.num_parts) over the balanced schedule, or, with `direct_split` (a call of one
// request), (num_tiles, params.num_splits) equal runs of the request's blocks in the uniform
// layout. `pair` (the route's choice: balanced schedule only, never with `clean` or an e4m3 cache):
// tiles 2k and 2k + 1 of a request read the same blocks (their rows are of the same query tokens),
// and run as a cluster of two sharing each block's loads (docs/sm90-seesaw.md, Pairs). `clean`:
// rows of a tile may attend the request's draft keys unequally (a custom mask, or tiles that span
// two tokens); the kernel then keeps a non-finite draft key from reaching the rows that do not
// attend it (seesaw_kernel.cuh, kClean). `evict_first` (the route's choice: balanced schedule,
// unpaired, uncleaned, 16-bit caches): the cache boxes carry the evict-first L2 policy, so that the
// partials the combine reads back stay in L2 (docs/sm90-seesaw.md, the direct split).
// q_map: the query's tensor map where params.query_tma (tma::make_query_tensor_map), else unused.
template <Elem Q, Elem KV>
cudaError_t launch_seesaw(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                          const CUtensorMap& q_map, int num_tiles, bool direct_split, bool pair,
                          bool clean, bool evict_first, cudaStream_t stream, bool pdl);

// A sparse call: grid (num_tiles, num_tokens, params.num_splits), one token per CTA
// (tma::SparseTokenCursor), or with params.sparse_rows below num_tokens that many token rows whose
// CTAs walk several tokens (tma::SparseCursor, their own instantiation); tiles of 64 of one
// token's heads, partials in the uniform layout [split, T, H] (or out and lse with one split), the
// blocks gathered by index (tma/gather.cuh); one explicit instantiation per (query, kv_cache) pair
// of tma::Formats, fp8_ds_mla included. `short_splits` (the route's choice; fp8_ds_mla rows,
// unpaired, one token per CTA row, else ignored): the splits hold fewer than kAheadMinBlocks blocks
// and gather on the landing path. q_map: the query's tensor map where params.query_tma (a uniform
// call of 16-bit query, H a multiple of 64: tma::make_query_tensor_map), else unused.
template <Elem Q, Elem KV>
cudaError_t launch_seesaw_sparse(const DecodeKernelParams& params, const CUtensorMap& q_map,
                                 int num_tiles, bool pair, bool short_splits, cudaStream_t stream,
                                 bool pdl);

// An e4m3 query over an e4m3 cache on the FP8 tensor cores (seesaw_fp8_kernel.cuh): grid
// (num_tiles, params.num_parts) over the balanced schedule, or (num_tiles, params.num_splits) with
// `direct_split`; kv_map: the e4m3 boxes with the 64-byte swizzle (tma::make_kv_tensor_map's
// fp8_direct); q_map: the e4m3 query's tensor map where params.query_tma
// (tma::make_query_tensor_map), else unused.
template <Elem Q, Elem KV>
cudaError_t launch_seesaw_fp8(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                              const CUtensorMap& q_map, int num_tiles, bool direct_split,
                              cudaStream_t stream, bool pdl);

// The same on the balanced schedule with three consumer warpgroups (seesaw_fp8_three_kernel.cuh):
// grid (num_tiles, params.num_parts).
template <Elem Q, Elem KV>
cudaError_t launch_seesaw_fp8_three(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                                    const CUtensorMap& q_map, int num_tiles, cudaStream_t stream,
                                    bool pdl);

// Clusters of two CTAs of the paired kernel that the current device holds at once (read once per
// device; 0 where the query fails). The route pairs a grid only where they hold all of it.
template <Elem E>
int pair_clusters_resident();

}  // namespace mla::sm90::seesaw
