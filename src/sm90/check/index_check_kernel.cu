// Checked mode (validate_indices): inspects the contents of the index tensors on the device and
// records the smallest key (IndexCheck kind << 56 | entry) of a bad entry. The host reads the
// record back and reports it; nothing else is launched for bad input.
//
// Grid mapping: a grid-stride loop over the flattened entries of every check, in the cpu
// backend's order: seq_lens [B], cum_seq_lens_q [B + 2 checks], block_tables [B, max_pages],
// sparse_topk_lens, sparse_indices [T, top_k], and for [B, 2, max_pages] tables row 1 against
// row 0 [B, max_pages].
#include "sm90/check/launch.h"
#include "sm90/common.cuh"

namespace mla::sm90::check {
namespace {

__device__ __forceinline__ void report(const IndexCheckParams& p, IndexCheck kind,
                                       unsigned long long entry) {
  atomicMin(p.record, (static_cast<unsigned long long>(kind) << kIndexCheckShift) | entry);
}

__device__ __forceinline__ bool seq_len_ok(const IndexCheckParams& p, int b) {
  const int64_t len = p.seq_lens[b];
  if (len < 0 || len > p.max_seq_len) return false;
  if (p.top_k == 0 && len > static_cast<int64_t>(p.max_pages) * p.page_size) return false;
  return true;
}

// Request of global token t (clamped: a bad cum_seq_lens_q is reported on its own).
__device__ __forceinline__ void token_of(const IndexCheckParams& p, int t, int* b, int* i) {
  if (p.cum_seq_lens_q == nullptr) {
    *b = t / p.q_len;
    *i = t - *b * p.q_len;
    return;
  }
  int lo = 0;
  for (int r = 0; r < p.batch; ++r) {  // linear: the checked mode is not a fast path
    if (p.cum_seq_lens_q[r] <= t) lo = r;
  }
  *b = lo;
  *i = t;
}

// Query tokens of request b and the position of global token t among them.
__device__ __forceinline__ void token_place(const IndexCheckParams& p, int b, int t, int* n,
                                            int* i) {
  if (p.cum_seq_lens_q == nullptr) {
    *n = p.q_len;
    *i = t - b * p.q_len;
    return;
  }
  *n = p.cum_seq_lens_q[b + 1] - p.cum_seq_lens_q[b];
  *i = t - p.cum_seq_lens_q[b];
}

__global__ void index_check_kernel(const __grid_constant__ IndexCheckParams p) {
  pdl_wait();
  const int64_t num_seq = p.batch;
  const int64_t num_cum = p.cum_seq_lens_q != nullptr ? p.batch + 2 : 0;
  const int64_t num_bt = p.top_k == 0 ? static_cast<int64_t>(p.batch) * p.max_pages : 0;
  const int64_t num_tl =
      p.topk_lens == nullptr ? 0 : (p.topk_lens_per_token ? p.num_tokens : p.batch);
  const int64_t num_si = p.top_k > 0 ? static_cast<int64_t>(p.num_tokens) * p.top_k : 0;
  const int64_t num_kv = p.block_table_kv_stride != 0 ? num_bt : 0;
  const int64_t total = num_seq + num_cum + num_bt + num_tl + num_si + num_kv;

  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t k = e;
    if (k < num_seq) {
      if (!seq_len_ok(p, static_cast<int>(k))) report(p, IndexCheck::kSeqLens, k);
      continue;
    }
    k -= num_seq;
    if (k < num_cum) {
      // Entry 0: cum[0] == 0; entry r + 1: request r's length; entry B + 1: cum[B] == T.
      const int32_t* cum = p.cum_seq_lens_q;
      if (k == 0) {
        if (cum[0] != 0) report(p, IndexCheck::kCumSeqLensQ, 0);
      } else if (k <= p.batch) {
        const int64_t n = static_cast<int64_t>(cum[k]) - cum[k - 1];
        if (n < 0 || n > p.max_q_len || (p.mask_bits > 0 && n > p.mask_bits)) {
          report(p, IndexCheck::kCumSeqLensQ, k);
        }
      } else if (cum[p.batch] != p.num_tokens) {
        report(p, IndexCheck::kCumSeqLensQ, k);
      }
      continue;
    }
    k -= num_cum;
    if (k < num_bt) {
      const int b = static_cast<int>(k / p.max_pages), page = static_cast<int>(k % p.max_pages);
      if (!seq_len_ok(p, b)) continue;  // reported as a seq_lens entry
      const int64_t pages_needed =
          (static_cast<int64_t>(p.seq_lens[b]) + p.page_size - 1) / p.page_size;
      if (page >= pages_needed) continue;  // never read
      const int32_t id = p.block_tables[b * p.block_table_stride + page];
      if (id < 0 || id >= p.num_pages) report(p, IndexCheck::kBlockTables, k);
      continue;
    }
    k -= num_bt;
    if (k < num_tl) {
      int64_t offset;
      if (!p.topk_lens_per_token) {
        offset = k * p.tl_batch;
      } else {
        int b, i;
        token_of(p, static_cast<int>(k), &b, &i);
        offset = b * p.tl_batch + i * p.tl_token;
      }
      const int32_t len = p.topk_lens[offset];
      if (len < 0 || len > p.top_k) report(p, IndexCheck::kTopkLens, k);
      continue;
    }
    k -= num_tl;
    if (k < num_si) {
      const int t = static_cast<int>(k / p.top_k), entry = static_cast<int>(k % p.top_k);
      int b, i;
      token_of(p, t, &b, &i);
      int64_t count = p.top_k;
      if (p.topk_lens != nullptr) {
        count =
            p.topk_lens[p.topk_lens_per_token ? b * p.tl_batch + i * p.tl_token : b * p.tl_batch];
        count = count < 0 ? 0 : (count > p.top_k ? p.top_k : count);
      }
      // The causal bound: token i of n counts at most seq_len - n + i + 1 entries (a bad
      // seq_lens or cum_seq_lens_q entry is reported on its own).
      int n, i_local;
      token_place(p, b, t, &n, &i_local);
      const int64_t visible = static_cast<int64_t>(p.seq_lens[b]) - n + i_local + 1;
      if (visible < count) count = visible;
      if (entry >= count) continue;
      const int32_t slot = p.sparse_indices[b * p.si_batch + i * p.si_token + entry];
      if (slot < -1 || slot >= static_cast<int64_t>(p.num_pages) * p.page_size) {
        report(p, IndexCheck::kSparseIndices, k);
      }
      continue;
    }
    k -= num_si;
    if (k < num_kv) {
      // Separate K/V page tables: row 1 names the same pages as row 0 wherever a page is read.
      const int b = static_cast<int>(k / p.max_pages), page = static_cast<int>(k % p.max_pages);
      if (!seq_len_ok(p, b)) continue;
      const int64_t pages_needed =
          (static_cast<int64_t>(p.seq_lens[b]) + p.page_size - 1) / p.page_size;
      if (page >= pages_needed) continue;
      const int32_t* row0 = p.block_tables + b * p.block_table_stride;
      if (row0[p.block_table_kv_stride + page] != row0[page]) {
        report(p, IndexCheck::kKvPageTables, k);
      }
    }
  }
}

}  // namespace

cudaError_t launch_index_check(const IndexCheckParams& params, cudaStream_t stream, bool pdl) {
  return launch(&index_check_kernel, dim3(132), dim3(256), 0, stream, pdl, params);
}

}  // namespace mla::sm90::check
