// sm90 backend, host side: the entry points (workspace_size, plan, run), the checked mode, the
// kernel parameters and the launches. Nothing here allocates, syncs or copies to the host, except
// the opt-in checked mode, which syncs once to report a bad index before the decode is launched.
// Which kernel runs, with how many splits, in which workspace layout: route.h, computed once per
// call; docs/architecture.md has the route table.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "host/backends.h"
#include "host/bad_index.h"
#include "host/check.h"
#include "sm90/check/launch.h"
#include "sm90/decode/combine/launch.h"
#include "sm90/decode/few_rows/launch.h"
#include "sm90/decode/schedule/launch.h"
#include "sm90/decode/seesaw/launch.h"
#include "sm90/decode/simt/launch.h"
#include "sm90/decode/tma/tensor_map.h"
#include "sm90/host/device.h"
#include "sm90/host/route.h"
#include "sm90/host/switches.h"
#include "sm90/params.h"

namespace mla::detail::sm90 {
namespace {

using ::mla::sm90::DecodeKernelParams;
using ::mla::sm90::Elem;
using ::mla::sm90::IndexCheck;
using ::mla::sm90::IndexCheckParams;
namespace check = ::mla::sm90::check;
namespace combine = ::mla::sm90::combine;
namespace few_rows = ::mla::sm90::few_rows;
namespace schedule = ::mla::sm90::schedule;
namespace seesaw = ::mla::sm90::seesaw;
namespace simt = ::mla::sm90::simt;
namespace tma = ::mla::sm90::tma;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int log2_exact(int64_t v) {
  int s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}

// ---- checked mode ----

template <typename T>
T read_one(const void* base, int64_t index) {
  T value{};
  MLA_CUDA_CHECK(
      cudaMemcpy(&value, static_cast<const T*>(base) + index, sizeof(T), cudaMemcpyDeviceToHost),
      "reading an index entry back");
  return value;
}

// Reads back the entry (or entries) that the index check's record key names and throws the
// message the cpu backend gives for it (host/bad_index.h).
[[noreturn]] void report_bad_index(const Problem& p, const DecodeParams& prm,
                                   unsigned long long key) {
  const auto kind = static_cast<IndexCheck>(key >> ::mla::sm90::kIndexCheckShift);
  const int64_t k = static_cast<int64_t>(key & ((1ull << ::mla::sm90::kIndexCheckShift) - 1));
  switch (kind) {
    case IndexCheck::kSeqLens:
      bad_index::fail(bad_index::seq_len(
          p, k, read_one<int32_t>(prm.seq_lens.data, k * prm.seq_lens.strides[0])));
    case IndexCheck::kCumSeqLensQ: {
      // Entry 0: cum[0]; entry b + 1: request b; entry B + 1: cum[B].
      const void* cum = prm.cum_seq_lens_q.data;
      if (k == 0) bad_index::fail(bad_index::cum_seq_lens_q_first(read_one<int32_t>(cum, 0)));
      if (k <= p.batch) {
        bad_index::fail(bad_index::cum_seq_lens_q_request(p, k - 1, read_one<int32_t>(cum, k - 1),
                                                          read_one<int32_t>(cum, k)));
      }
      bad_index::fail(bad_index::cum_seq_lens_q_last(p, read_one<int32_t>(cum, p.batch)));
    }
    case IndexCheck::kBlockTables: {
      const int64_t b = k / p.max_pages, page = k % p.max_pages;
      bad_index::fail(bad_index::page(
          p, b, page, read_one<int32_t>(prm.block_tables.data, b * p.block_table_stride + page)));
    }
    case IndexCheck::kKvPageTables: {
      const int64_t b = k / p.max_pages, page = k % p.max_pages;
      const int64_t row0 = b * p.block_table_stride + page;
      bad_index::fail(bad_index::kv_page(
          b, page, read_one<int32_t>(prm.block_tables.data, row0),
          read_one<int32_t>(prm.block_tables.data, row0 + p.block_table_kv_stride)));
    }
    case IndexCheck::kTopkLens: {
      // Entry k: request k ([B] lengths) or global query token k (per-token lengths).
      int64_t offset = k * p.topk_lens.batch;
      if (p.topk_lens_mode == TopkLensMode::kPerToken) {
        offset = p.ragged ? k * p.topk_lens.token
                          : (k / p.q_len) * p.topk_lens.batch + (k % p.q_len) * p.topk_lens.token;
      }
      bad_index::fail(
          bad_index::topk_len(p, k, read_one<int32_t>(prm.sparse_topk_lens.data, offset)));
    }
    case IndexCheck::kSparseIndices: {
      const int64_t t = k / p.top_k, e = k % p.top_k;
      const int64_t offset = p.ragged ? t * p.sparse_indices.token
                                      : (t / p.q_len) * p.sparse_indices.batch +
                                            (t % p.q_len) * p.sparse_indices.token;
      bad_index::fail(
          bad_index::sparse_index(p, t, e, read_one<int32_t>(prm.sparse_indices.data, offset + e)));
    }
  }
  throw Error(ErrorCode::kBadIndex,
              "index check: unknown record " + std::to_string(static_cast<int64_t>(key)));
}

void check_indices(const Problem& p, const DecodeParams& prm, uint8_t* workspace,
                   cudaStream_t stream) {
  IndexCheckParams c;
  c.seq_lens = static_cast<const int32_t*>(prm.seq_lens.data);
  if (p.ragged) c.cum_seq_lens_q = static_cast<const int32_t*>(prm.cum_seq_lens_q.data);
  if (p.sparse) {
    c.sparse_indices = static_cast<const int32_t*>(prm.sparse_indices.data);
    if (p.topk_lens_mode != TopkLensMode::kNone) {
      c.topk_lens = static_cast<const int32_t*>(prm.sparse_topk_lens.data);
    }
  } else {
    c.block_tables = static_cast<const int32_t*>(prm.block_tables.data);
  }
  c.record = reinterpret_cast<unsigned long long*>(workspace);
  c.batch = static_cast<int32_t>(p.batch);
  c.num_tokens = static_cast<int32_t>(p.num_tokens);
  c.q_len = static_cast<int32_t>(p.q_len);
  c.max_pages = static_cast<int32_t>(p.max_pages);
  c.page_size = static_cast<int32_t>(p.page_size);
  c.num_pages = static_cast<int32_t>(p.num_pages);
  c.top_k = static_cast<int32_t>(p.top_k);
  c.max_seq_len = static_cast<int32_t>(std::min<int64_t>(p.max_seq_len, INT32_MAX));
  c.max_q_len = static_cast<int32_t>(std::min<int64_t>(p.max_q_len, INT32_MAX));
  c.mask_bits = p.has_mask && !p.sparse ? static_cast<int32_t>(p.mask_words * 32) : 0;
  c.topk_lens_per_token = p.topk_lens_mode == TopkLensMode::kPerToken;
  c.block_table_stride = p.block_table_stride;
  c.block_table_kv_stride = p.kv_page_tables ? p.block_table_kv_stride : 0;
  c.si_batch = p.sparse_indices.batch;
  c.si_token = p.sparse_indices.token;
  c.tl_batch = p.topk_lens.batch;
  c.tl_token = p.topk_lens.token;

  MLA_CUDA_CHECK(cudaMemsetAsync(c.record, 0xff, sizeof(unsigned long long), stream),
                 "clearing the index check record");
  MLA_CUDA_CHECK(check::launch_index_check(c, stream, prm.enable_pdl), "launching the index check");
  unsigned long long key = 0;
  MLA_CUDA_CHECK(cudaMemcpyAsync(&key, c.record, sizeof(key), cudaMemcpyDeviceToHost, stream),
                 "reading the index check record");
  MLA_CUDA_CHECK(cudaStreamSynchronize(stream), "the index check");
  if (key != ::mla::sm90::kNoBadIndex) report_bad_index(p, prm, key);
}

// ---- the decode ----

// The balanced schedule's pieces of the workspace, for the kernels that read it.
void schedule_view(const Layout& layout, uint8_t* workspace, int64_t batch, DecodeKernelParams& k) {
  k.sched_requests = reinterpret_cast<const schedule::Request*>(workspace + layout.requests_offset);
  k.sched_tokens = reinterpret_cast<const schedule::Token*>(workspace + layout.tokens_offset);
  k.sched_part_first = reinterpret_cast<const int32_t*>(workspace + layout.part_first_offset);
  k.sched_part_blocks = reinterpret_cast<const int32_t*>(workspace + layout.part_blocks_offset);
  k.num_parts = static_cast<int32_t>(layout.parts);
  // The combine's CTA shape follows the typical splits of a request: one, plus the part
  // boundaries that fall inside it.
  k.num_splits = static_cast<int32_t>(std::min(layout.parts, 1 + ceil_div(layout.parts, batch)));
}

DecodeKernelParams kernel_params(const Problem& p, const DecodeParams& prm, uint8_t* workspace,
                                 const Layout& layout) {
  DecodeKernelParams k;
  k.query = prm.query.data;
  k.kv = prm.kv_cache.data;
  if (!p.sparse) k.block_tables = static_cast<const int32_t*>(prm.block_tables.data);
  k.seq_lens = static_cast<const int32_t*>(prm.seq_lens.data);
  if (p.ragged) k.cum_seq_lens_q = static_cast<const int32_t*>(prm.cum_seq_lens_q.data);
  if (p.has_sinks) {
    k.sinks = prm.sinks.data;
    k.sinks_stride = prm.sinks.strides[0];
    k.sinks_elem = p.sinks_dtype == dtype::kBFloat16 ? 1 : p.sinks_dtype == dtype::kFloat16 ? 2 : 0;
  }
  if (p.has_mask && !p.sparse) {
    const int64_t bytes = prm.mask.dtype.bits / 8;
    k.mask = static_cast<const uint8_t*>(prm.mask.data);
    k.mask_batch = p.mask.batch * bytes;
    k.mask_token = p.mask.token * bytes;
  }
  if (p.sparse) {
    k.sparse_indices = static_cast<const int32_t*>(prm.sparse_indices.data);
    k.si_batch = p.sparse_indices.batch;
    k.si_token = p.sparse_indices.token;
    if (p.topk_lens_mode != TopkLensMode::kNone) {
      k.topk_lens = static_cast<const int32_t*>(prm.sparse_topk_lens.data);
      k.tl_batch = p.topk_lens.batch;
      k.tl_token = p.topk_lens.token;
    }
  }
  if (p.has_bmm1_tensor) k.bmm1_scale_ptr = static_cast<const float*>(prm.bmm1_scale_tensor.data);
  if (p.has_bmm2_tensor) k.bmm2_scale_ptr = static_cast<const float*>(prm.bmm2_scale_tensor.data);
  k.out = prm.out.data;
  k.out_fp16 = p.out_dtype == dtype::kFloat16 ? 1 : 0;
  k.out_vec16 = reinterpret_cast<uintptr_t>(k.out) % 16 == 0 && p.out.batch % 8 == 0 &&
                p.out.token % 8 == 0 && p.out.head % 8 == 0;
  k.out_vec8 = reinterpret_cast<uintptr_t>(k.out) % 8 == 0 && p.out.batch % 4 == 0 &&
               p.out.token % 4 == 0 && p.out.head % 4 == 0;
  if (p.has_lse) k.lse = static_cast<float*>(prm.lse.data);
  k.partial_max = reinterpret_cast<float*>(workspace + layout.max_offset);
  k.partial_sum = reinterpret_cast<float*>(workspace + layout.sum_offset);
  k.partial_o = workspace + layout.o_offset;

  k.batch = static_cast<int32_t>(p.batch);
  k.num_tokens = static_cast<int32_t>(p.num_tokens);
  k.q_len = static_cast<int32_t>(p.q_len);
  k.num_heads = static_cast<int32_t>(p.num_heads);
  k.num_splits = static_cast<int32_t>(layout.splits);
  k.page_size = static_cast<int32_t>(p.page_size);
  k.page_shift = log2_exact(p.page_size);
  k.num_pages = static_cast<int32_t>(p.num_pages);
  k.top_k = static_cast<int32_t>(p.top_k);
  k.consumer_fence = switches().consumer_fence ? 1 : 0;
  k.kv_lora_rank = static_cast<int32_t>(p.L);
  k.rope_dim = static_cast<int32_t>(p.R);
  for (int c = 0; c < 9; ++c) {
    const int64_t col = c < 8 ? (64 * c < p.L ? 64 * c : -1) : (p.R > 0 ? p.L : -1);
    k.chunk_box[c] = static_cast<int32_t>(col >= 0 ? col : p.L + p.R);
  }
  k.q_batch = p.q.batch;
  k.q_token = p.q.token;
  k.q_head = p.q.head;
  k.out_batch = p.out.batch;
  k.out_token = p.out.token;
  k.out_head = p.out.head;
  k.lse_batch = p.lse.batch;
  k.lse_token = p.lse.token;
  k.lse_head = p.lse.head;
  k.kv_page_stride = p.kv_page_stride;
  k.kv_row_stride = p.kv_row_stride;
  {
    const int64_t kv_bytes = p.kv_dtype.bits / 8;
    k.kv_page16 = static_cast<uint32_t>(p.kv_page_stride * kv_bytes / 16);
    k.kv_row16 = static_cast<uint32_t>(p.kv_row_stride * kv_bytes / 16);
  }
  k.block_table_stride = p.block_table_stride;
  k.bmm1_scale = prm.bmm1_scale;
  k.bmm2_scale = prm.bmm2_scale;
  k.skip_softmax_factor = p.skip_softmax_factor;
  return k;
}

// Whether the call's data addresses and kv_cache strides fit the TMA kernels: 16-byte-aligned
// query and kv_cache, and a tensor map the driver accepts (written to `kv_map`; e4m3 boxes
// swizzled for the FP8 tensor cores where `fp8_direct`).
bool tma_ready(const DecodeKernelParams& k, Elem kv, CUtensorMap* kv_map, bool fp8_direct) {
  const bool aligned =
      reinterpret_cast<uintptr_t>(k.query) % 16 == 0 && reinterpret_cast<uintptr_t>(k.kv) % 16 == 0;
  return aligned && tma::make_kv_tensor_map(k, kv, kv_map, fp8_direct) == cudaSuccess;
}

// The SIMT kernel of head dims (L, R) for the plain (query, kv_cache) element pairs.
template <int L, int R>
cudaError_t launch_simt_dims(Elem q, Elem kv, const DecodeKernelParams& k, cudaStream_t stream,
                             bool pdl) {
  if (q == Elem::kBf16 && kv == Elem::kBf16) {
    return simt::launch_simt<Elem::kBf16, Elem::kBf16, L, R>(k, stream, pdl);
  }
  if (q == Elem::kFp16 && kv == Elem::kFp16) {
    return simt::launch_simt<Elem::kFp16, Elem::kFp16, L, R>(k, stream, pdl);
  }
  if (q == Elem::kFp8E4M3 && kv == Elem::kFp8E4M3) {
    return simt::launch_simt<Elem::kFp8E4M3, Elem::kFp8E4M3, L, R>(k, stream, pdl);
  }
  if (q == Elem::kBf16 && kv == Elem::kFp8E4M3) {
    return simt::launch_simt<Elem::kBf16, Elem::kFp8E4M3, L, R>(k, stream, pdl);
  }
  MLA_FAIL(ErrorCode::kUnsupported, "backend sm90: no kernel for this (query, kv_cache) pair");
}

// The few-rows kernel of N padded rows for the (query, kv_cache) pairs the TMA kernels take
// (tma::Formats).
template <int N>
cudaError_t launch_few_rows_pair(Elem q, Elem kv, const DecodeKernelParams& k,
                                 const CUtensorMap& kv_map, cudaStream_t stream, bool pdl,
                                 const Route& route) {
  const bool fp8_direct = route.fp8_direct;
  if (q == Elem::kBf16 && kv == Elem::kBf16) {
    return few_rows::launch_few_rows<Elem::kBf16, Elem::kBf16, N>(k, kv_map, stream, pdl);
  }
  if (q == Elem::kFp16 && kv == Elem::kFp16) {
    return few_rows::launch_few_rows<Elem::kFp16, Elem::kFp16, N>(k, kv_map, stream, pdl);
  }
  if (q == Elem::kBf16 && kv == Elem::kFp8E4M3) {
    return few_rows::launch_few_rows<Elem::kBf16, Elem::kFp8E4M3, N>(
        k, kv_map, stream, pdl, fp8_direct, false, route.few_rows_three);
  }
  if (q == Elem::kFp8E4M3 && kv == Elem::kFp8E4M3) {
    return few_rows::launch_few_rows<Elem::kFp8E4M3, Elem::kFp8E4M3, N>(
        k, kv_map, stream, pdl, fp8_direct, route.few_rows_deep);
  }
  if (q == Elem::kBf16 && kv == Elem::kFp8DsMla) {
    return few_rows::launch_few_rows<Elem::kBf16, Elem::kFp8DsMla, N>(k, kv_map, stream, pdl);
  }
  MLA_FAIL(ErrorCode::kUnsupported,
           "backend sm90: no few-rows kernel for this (query, kv_cache) pair");
}

// The same for the seesaw kernel.
cudaError_t launch_seesaw_pair(Elem q, Elem kv, const DecodeKernelParams& k,
                               const CUtensorMap& kv_map, const CUtensorMap& q_map,
                               const Route& route, cudaStream_t stream, bool pdl) {
  const bool direct = route.layout.direct;
  if (q == Elem::kBf16 && kv == Elem::kBf16) {
    return seesaw::launch_seesaw<Elem::kBf16, Elem::kBf16>(k, kv_map, q_map, route.tiles, direct,
                                                           route.pair, route.clean,
                                                           route.evict_first, stream, pdl);
  }
  if (q == Elem::kFp16 && kv == Elem::kFp16) {
    return seesaw::launch_seesaw<Elem::kFp16, Elem::kFp16>(k, kv_map, q_map, route.tiles, direct,
                                                           route.pair, route.clean,
                                                           route.evict_first, stream, pdl);
  }
  if (q == Elem::kBf16 && kv == Elem::kFp8E4M3) {
    return seesaw::launch_seesaw<Elem::kBf16, Elem::kFp8E4M3>(k, kv_map, q_map, route.tiles, direct,
                                                              route.pair, route.clean,
                                                              route.evict_first, stream, pdl);
  }
  if (q == Elem::kFp8E4M3 && kv == Elem::kFp8E4M3) {
    if (route.fp8_direct) {
      if (route.fp8_three) {
        return seesaw::launch_seesaw_fp8_three<Elem::kFp8E4M3, Elem::kFp8E4M3>(
            k, kv_map, q_map, route.tiles, stream, pdl);
      }
      return seesaw::launch_seesaw_fp8<Elem::kFp8E4M3, Elem::kFp8E4M3>(
          k, kv_map, q_map, route.tiles, direct, stream, pdl);
    }
    return seesaw::launch_seesaw<Elem::kFp8E4M3, Elem::kFp8E4M3>(k, kv_map, q_map, route.tiles,
                                                                 direct, route.pair, route.clean,
                                                                 route.evict_first, stream, pdl);
  }
  if (q == Elem::kBf16 && kv == Elem::kFp8DsMla) {
    return seesaw::launch_seesaw<Elem::kBf16, Elem::kFp8DsMla>(k, kv_map, q_map, route.tiles,
                                                               direct, route.pair, route.clean,
                                                               route.evict_first, stream, pdl);
  }
  MLA_FAIL(ErrorCode::kUnsupported,
           "backend sm90: no seesaw kernel for this (query, kv_cache) pair");
}

// The sparse instantiations of both kernels (tma/gather.cuh) for the pairs of tma::Formats with
// fp8_ds_mla: the seesaw kernel (route.tiles tiles per token) or the few-rows kernel of N rows.
template <Elem Q, Elem KV>
cudaError_t launch_sparse_as(const DecodeKernelParams& k, const CUtensorMap& q_map,
                             const Route& route, cudaStream_t stream, bool pdl) {
  if (route.kernel == Kernel::kSeesaw) {
    return seesaw::launch_seesaw_sparse<Q, KV>(k, q_map, route.tiles, route.pair,
                                               route.short_splits, stream, pdl);
  }
  const bool direct = route.fp8_direct;
  const bool deep = route.few_rows_deep;
  if (route.few_rows == 16) {
    return few_rows::launch_few_rows_sparse<Q, KV, 16>(k, stream, pdl, direct, deep,
                                                       route.few_rows_three, route.pair_merge);
  }
  if constexpr (KV == Elem::kFp8DsMla) {
    return cudaErrorInvalidValue;  // fp8_ds_mla rows take it at 16 rows only (route.cc, family_of)
  } else {
    return few_rows::launch_few_rows_sparse<Q, KV, 32>(k, stream, pdl, direct, deep);
  }
}

cudaError_t launch_sparse(Elem q, Elem kv, const DecodeKernelParams& k, const CUtensorMap& q_map,
                          const Route& route, cudaStream_t stream, bool pdl) {
  using E = Elem;
  if (q == E::kBf16 && kv == E::kBf16) {
    return launch_sparse_as<E::kBf16, E::kBf16>(k, q_map, route, stream, pdl);
  }
  if (q == E::kFp16 && kv == E::kFp16) {
    return launch_sparse_as<E::kFp16, E::kFp16>(k, q_map, route, stream, pdl);
  }
  if (q == E::kBf16 && kv == E::kFp8E4M3) {
    return launch_sparse_as<E::kBf16, E::kFp8E4M3>(k, q_map, route, stream, pdl);
  }
  if (q == E::kFp8E4M3 && kv == E::kFp8E4M3) {
    return launch_sparse_as<E::kFp8E4M3, E::kFp8E4M3>(k, q_map, route, stream, pdl);
  }
  if (q == E::kBf16 && kv == E::kFp8DsMla) {
    return launch_sparse_as<E::kBf16, E::kFp8DsMla>(k, q_map, route, stream, pdl);
  }
  MLA_FAIL(ErrorCode::kUnsupported,
           "backend sm90: no sparse gather kernel for this (query, kv_cache) pair");
}

// Launches the route's decode kernel; `k` is the call's parameters in the uniform layout, to which
// the balanced schedule's pieces are added where the seesaw or few-rows kernel runs on it (the
// combine then reads them too).
cudaError_t launch_decode(const Problem& p, const Route& route, Elem q, Elem kv,
                          DecodeKernelParams& k, const CUtensorMap& kv_map, uint8_t* workspace,
                          cudaStream_t stream, bool pdl) {
  CUtensorMap q_map{};
  // One split: out and lse without a combine (a pair merge's splits write partials: its first
  // merges them).
  k.direct_out = route.combine || route.pair_merge ? 0 : 1;
  if (route.sparse) {
    // The seesaw kernel's query tiles through the tensor map where it can be made for a sparse
    // call (16-bit query whatever the cache holds, head dims (512, 64), a uniform call of H a
    // multiple of 64: a tile is 64 heads of one token), asked for before the token's extent is
    // read (docs/sm90-sparse.md, The CTA's start and end).
    k.query_tma = route.kernel == Kernel::kSeesaw && switches().query_tma && q != Elem::kFp8E4M3 &&
                  k.cum_seq_lens_q == nullptr && k.num_heads % tma::kTileRows == 0 &&
                  tma::make_query_tensor_map(k, q, &q_map) == cudaSuccess;
    return launch_sparse(q, kv, k, q_map, route, stream, pdl);
  }
  switch (route.kernel) {
    case Kernel::kFewRows:
      if (route.layout.scheduled) schedule_view(route.layout, workspace, p.batch, k);
      return route.few_rows == 16 ? launch_few_rows_pair<16>(q, kv, k, kv_map, stream, pdl, route)
                                  : launch_few_rows_pair<32>(q, kv, k, kv_map, stream, pdl, route);
    case Kernel::kSeesaw: {
      const Layout& l = route.layout;
      if (l.scheduled) schedule_view(l, workspace, p.batch, k);
      // The query tiles through the tensor map where it can be made (16-bit query and cache, or
      // an e4m3 query over an e4m3 cache on the FP8 seesaw kernels; head dims (512, 64), H a
      // multiple of 64 or a divisor of 64 with a dense query; docs/sm90-seesaw.md, The query
      // tile).
      k.query_tma = switches().query_tma && q == kv && (q != Elem::kFp8E4M3 || route.fp8_direct) &&
                    tma::make_query_tensor_map(k, q, &q_map) == cudaSuccess;
      k.hold_first_s = switches().hold_first_s ? 1 : 0;
      return launch_seesaw_pair(q, kv, k, kv_map, q_map, route, stream, pdl);
    }
    case Kernel::kSimt:
      if (p.L == 256 && p.R == 64) return launch_simt_dims<256, 64>(q, kv, k, stream, pdl);
      if (p.L == 512 && p.R == 0) return launch_simt_dims<512, 0>(q, kv, k, stream, pdl);
      if (q == Elem::kBf16 && kv == Elem::kFp8DsMla) {
        return simt::launch_simt<Elem::kBf16, Elem::kFp8DsMla>(k, stream, pdl);
      }
      return launch_simt_dims<512, 64>(q, kv, k, stream, pdl);
    case Kernel::kNone:
      return cudaSuccess;
  }
  MLA_FAIL(ErrorCode::kUnsupported, "backend sm90: no kernel for this (query, kv_cache) pair");
}

}  // namespace

size_t workspace_size(const Problem& problem) {
  DeviceGuard guard(problem.device.device_id);
  return static_cast<size_t>(route_of(problem).layout.bytes);
}

void plan(const Problem& p, const DecodeParams& prm) {
  // The SIMT kernel, the uniform splits and the seesaw kernel's direct split derive each CTA's key
  // range from seq_lens on the device; the balanced schedule is written into the workspace here.
  if (p.batch == 0) return;
  DeviceGuard guard(p.device.device_id);
  const Route route = route_of(p);
  const Layout& layout = route.layout;
  if (!layout.scheduled) return;
  auto* workspace = static_cast<uint8_t*>(prm.workspace.data);
  DecodeKernelParams k = kernel_params(p, prm, workspace, layout);
  schedule_view(layout, workspace, p.batch, k);
  schedule::Outputs out;
  out.requests = reinterpret_cast<schedule::Request*>(workspace + layout.requests_offset);
  out.tokens = reinterpret_cast<schedule::Token*>(workspace + layout.tokens_offset);
  out.part_first = reinterpret_cast<int32_t*>(workspace + layout.part_first_offset);
  out.part_blocks = reinterpret_cast<int32_t*>(workspace + layout.part_blocks_offset);
  const int max_blocks = static_cast<int>(ceil_div(p.max_seq_len, ::mla::sm90::kBlockKeys));
  MLA_CUDA_CHECK(
      schedule::launch_schedule(k, out, static_cast<int>(p.max_q_len), max_blocks,
                                static_cast<int>(route.schedule_fixed_blocks),
                                static_cast<int>(switches().schedule_uniform_slack), layout.rows,
                                static_cast<cudaStream_t>(prm.stream), prm.enable_pdl),
      "launching the schedule kernel");
}

void run(const Problem& p, const DecodeParams& prm) {
  if (p.batch == 0) return;
  DeviceGuard guard(p.device.device_id);
  const auto stream = static_cast<cudaStream_t>(prm.stream);
  auto* workspace = static_cast<uint8_t*>(prm.workspace.data);
  Route route = route_of(p);
  if (prm.validate_indices) check_indices(p, prm, workspace, stream);
  if (route.kernel == Kernel::kNone) return;

  DecodeKernelParams k = kernel_params(p, prm, workspace, route.layout);
  const Elem q = elem_of(p.q_dtype);
  const Elem kv = p.kv_format == KvFormat::kFp8DsMla ? Elem::kFp8DsMla : elem_of(p.kv_dtype);
  CUtensorMap kv_map;
  // Gathered blocks (sparse calls, the fp8_ds_mla cache) take 16-byte copies: 16-byte-aligned
  // query and kv_cache, no tensor map.
  const bool gather = route.sparse || kv == Elem::kFp8DsMla;
  const bool ready = gather ? reinterpret_cast<uintptr_t>(k.query) % 16 == 0 &&
                                  reinterpret_cast<uintptr_t>(k.kv) % 16 == 0
                            : tma_ready(k, kv, &kv_map, route.fp8_direct);
  if ((route.kernel == Kernel::kFewRows || route.kernel == Kernel::kSeesaw) && !ready) {
    route = simt_fallback(route, p);
    k.num_splits = static_cast<int32_t>(route.layout.splits);
  }
  if (route.sparse && route.layout.order_offset > 0) {
    // NOTE: here, not in plan(): the order follows this call's sparse_topk_lens.
    auto* order = reinterpret_cast<int32_t*>(workspace + route.layout.order_offset);
    MLA_CUDA_CHECK(schedule::launch_sparse_order(k, order, stream, prm.enable_pdl),
                   "launching the sparse order kernel");
    k.sparse_order = order;
  }
  k.sparse_rows = static_cast<int32_t>(route.sparse_rows);
  MLA_CUDA_CHECK(launch_decode(p, route, q, kv, k, kv_map, workspace, stream, prm.enable_pdl),
                 "launching the split-KV decode kernel");
  if (!route.combine) return;  // the decode kernel wrote out and lse
  const int sms = sm_count(p.device.device_id);
  const int rows_max_splits = static_cast<int>(switches().combine_rows_max_splits);
  const bool one_batch = switches().combine_one_batch;
  const cudaError_t err = p.out_dtype == dtype::kBFloat16
                              ? combine::launch_combine<Elem::kBf16>(
                                    k, sms, rows_max_splits, one_batch, stream, prm.enable_pdl)
                              : combine::launch_combine<Elem::kFp16>(
                                    k, sms, rows_max_splits, one_batch, stream, prm.enable_pdl);
  MLA_CUDA_CHECK(err, "launching the combine kernel");
}

}  // namespace mla::detail::sm90
