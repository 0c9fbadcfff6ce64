// sm90 backend, host side: device checks, split policy, workspace layout, kernel parameters and
// launches. Nothing here allocates, syncs or copies to the host, except the opt-in checked mode,
// which syncs once to report a bad index before the decode is launched.
//
// Workspace layout (bytes; every piece 256-byte aligned):
//   [0, 256)                       checked mode record: one uint64 key (IndexCheck), ~0 when clean
//   partial_max [N] fp32           running max of each partial row (-inf: the split saw no key)
//   partial_sum [N] fp32           sum of exp(s - max)
//   partial_o [N, L] out dtype     bmm2_scale * sum of exp(s - max) * v / sum (0 where sum is 0)
//   v2 only: the balanced schedule (params.h): schedule::Request [B], schedule::Token [T] (the
//            tokens the combine merges), first request per part [parts] int32, positions per
//            part [1] int32
// with N partial rows: S x T x H in the uniform layout [S, T, H] (S = split_count below) of v0
// and the few-rows kernel, at most T x H + (parts - 1) x max_q_len x H for v2's segments (Layout);
// T query tokens, H heads, L = 512. plan() writes v2's schedule; run() reads it. v2's direct split
// (one request) uses the uniform layout with S = split_count() runs and no schedule.
//
// Kernel routing (docs/sm90-v1.md, docs/sm90-v2.md, docs/sm90-small-rows.md): the TMA + wgmma
// kernels take dense-mode bf16/bf16 and fp16/fp16 calls with page_size >= 16 and 16-byte-aligned
// query and kv_cache strides and addresses: the few-rows kernel (keys as the GEMM M, 16 or 32
// padded query rows) where H x max_q_len <= 32, v2 (seesaw, 64 query rows per CTA, one wave of
// CTAs over the balanced schedule that plan() writes; for a call of one request, the direct split:
// equal runs of the request's blocks, no schedule) otherwise;
// everything else (sparse mode, fp8 and fp8_ds_mla kv_cache, page_size < 16, other strides) runs on
// v0. MLA_SM90_KERNEL=v0 or v2 forces that kernel (rows: the few-rows kernel where it applies) for
// comparisons. All write the same partials, merged by v0's combine kernel, except where a row has
// one split: v2 writes out and lse itself for a request of one segment (the combine skips its
// tokens), and the few-rows kernel for a call of one split (no combine is launched).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "host/backends.h"
#include "host/check.h"
#include "sm90/check/launch.h"
#include "sm90/decode/combine/launch.h"
#include "sm90/decode/few_rows/launch.h"
#include "sm90/decode/schedule/launch.h"
#include "sm90/decode/seesaw/launch.h"
#include "sm90/decode/simt/launch.h"
#include "sm90/decode/tma/tensor_map.h"
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

constexpr int64_t kAlign = 256;
constexpr int64_t kMinKeysPerSplit = 256;  // v0: a split handles at least this many keys
constexpr int64_t kV0MaxSplits = 64;
constexpr int64_t kMaxSplits = 128;  // uniform splits per query token (v0, few-rows kernel)
static_assert(kMaxSplits <= ::mla::sm90::kMaxSplits, "the combine kernel's capacity");

int64_t align_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#define MLA_CUDA_CHECK(expr, what)                                                                \
  do {                                                                                            \
    const cudaError_t mla_cuda_err_ = (expr);                                                     \
    if (mla_cuda_err_ != cudaSuccess) {                                                           \
      MLA_FAIL(ErrorCode::kRuntimeError,                                                          \
               "backend sm90: " << what << " failed: " << cudaGetErrorName(mla_cuda_err_) << " (" \
                                << cudaGetErrorString(mla_cuda_err_) << ")");                     \
    }                                                                                             \
  } while (0)

// Makes `device` current for the scope; restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device)
      MLA_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice(" << device << ")");
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) {
      cudaSetDevice(previous_);
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Per-device facts, read once: compute capability and SM count (0: not read yet).
constexpr int kMaxDevices = 64;
std::array<std::atomic<int>, kMaxDevices> g_sm_count{};
std::array<std::atomic<int>, kMaxDevices> g_cc{};  // major * 10 + minor

int sm_count(int device) {
  int count = device < kMaxDevices ? g_sm_count[device].load() : 0;
  if (count == 0) {
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
                   "cudaDeviceGetAttribute(MultiProcessorCount, " << device << ")");
    if (device < kMaxDevices) g_sm_count[device].store(count);
  }
  return count;
}

// MLA_SM90_KERNEL in the environment (read once), for comparisons: v0 keeps every call on v0; v2
// runs the seesaw kernel on every call the TMA kernels take; rows (the default there) runs the
// few-rows kernel where it applies.
std::string forced_kernel() {
  static const std::string forced = [] {
    const char* v = std::getenv("MLA_SM90_KERNEL");
    return std::string(v != nullptr ? v : "");
  }();
  return forced;
}
bool v0_forced() { return forced_kernel() == "v0"; }

// Timing studies only (docs/perf-notes.md), read once: MLA_SM90_MAX_SPLITS=N caps the split count
// (it enters workspace_size too, so set it before the first call). Results stay correct.
int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : 0;
}
int64_t max_splits_override() {
  static const int64_t cap = env_int("MLA_SM90_MAX_SPLITS");
  return cap;
}
// MLA_SM90_SCHEDULE_FIXED=N: the balanced schedule's fixed cost per request in blocks (timing
// studies only; results stay correct).
int64_t schedule_fixed_blocks() {
  static const int64_t fixed = [] {
    const int64_t v = env_int("MLA_SM90_SCHEDULE_FIXED");
    return v > 0 ? std::min<int64_t>(v, 1 << 20) : ::mla::sm90::schedule::kFixedBlocks;
  }();
  return fixed;
}

// v1 query-row tiles of one request: ceil(max_q_len * H / 64).
int64_t v1_tiles(const Problem& p) { return ceil_div(p.max_q_len * p.num_heads, tma::kTileRows); }

// The shape part of v1's eligibility (the rest, data addresses and the tensor map, is checked at
// run time; a call that fails it runs v0 with v1's split count, which v0 accepts).
bool v1_shape_ok(const Problem& p) {
  if (v0_forced() || p.sparse || p.D != 576) return false;
  const bool bf16 = p.q_dtype == dtype::kBFloat16 && p.kv_dtype == dtype::kBFloat16;
  const bool fp16 = p.q_dtype == dtype::kFloat16 && p.kv_dtype == dtype::kFloat16;
  if (!bf16 && !fp16) return false;
  if (p.page_size < 16 || p.page_size > 256) return false;  // TMA boxes of >= 16 rows
  // 16-byte-aligned strides: TMA (kv rows and pages) and vector loads (query rows).
  if (p.kv_row_stride % 8 != 0 || p.kv_page_stride % 8 != 0) return false;
  if (p.q.batch % 8 != 0 || p.q.token % 8 != 0 || p.q.head % 8 != 0) return false;
  if (p.batch > 65535) return false;  // grid.y
  // Ragged queries without a tight max_q_len: the (tile, request) grid would be mostly empty.
  const int64_t tiles = v1_tiles(p);
  if (p.batch * tiles > 4 * ceil_div(p.num_tokens * p.num_heads, tma::kTileRows) + p.batch) {
    return false;
  }
  return true;
}

// The few-rows kernel takes requests of at most few_rows::kMaxRows query rows (H x max_q_len).
bool rows_shape_ok(const Problem& p) {
  return v1_shape_ok(p) && p.max_q_len * p.num_heads <= few_rows::kMaxRows &&
         forced_kernel() != "v2";
}

// Parts of the balanced schedule: one CTA per SM for each query-row tile of a request.
int64_t schedule_parts(const Problem& p) {
  const int64_t parts = sm_count(p.device.device_id) / v1_tiles(p);
  return std::clamp<int64_t>(
      parts, 1, std::min<int64_t>(::mla::sm90::kMaxSplits, ::mla::sm90::schedule::kMaxParts));
}

// v2 runs on the balanced schedule: every call the TMA kernels take that the few-rows kernel does
// not, within the schedule's int32 positions and partial rows.
bool v2_shape_ok(const Problem& p) {
  if (!v1_shape_ok(p) || rows_shape_ok(p)) return false;
  const int64_t max_blocks = ceil_div(p.max_seq_len, ::mla::sm90::kBlockKeys);
  const int64_t positions = p.batch * (max_blocks + schedule_fixed_blocks());
  const int64_t rows = (p.num_tokens + schedule_parts(p) * p.max_q_len) * p.num_heads;
  // NOTE: half the int32 range: a part's end (parts x positions per part) may pass the total by
  // the 10% whole-request rounding of schedule.cu.
  return positions < INT32_MAX / 2 && rows < INT32_MAX;
}

// v2's direct split: a call of one request runs split_count() equal runs of its blocks per
// query-row tile in the uniform layout, without the plan kernel (docs/sm90-v2.md).
// MLA_SM90_DIRECT=0 keeps such calls on the balanced schedule (comparisons).
bool v2_direct(const Problem& p) {
  static const bool disabled = [] {
    const char* v = std::getenv("MLA_SM90_DIRECT");
    return v != nullptr && std::string(v) == "0";
  }();
  return !disabled && p.batch == 1 && v2_shape_ok(p);
}

// v2's pairs: tiles 2k and 2k + 1 of every request cover the same query tokens (one token per
// tile pair at H = 128; one token at max_q_len 1), so their blocks and key ranges are the same and
// a cluster of the two loads each block once for both (docs/sm90-v2.md, Pairs). Taken on the
// balanced schedule from kPairMinTiles tiles per request up: below that, and on the direct split
// at any tile count, the two CTAs' lockstep cost more than the halved L2 traffic gave
// (docs/perf-notes.md, Change 59). MLA_SM90_PAIR=0 keeps every call unpaired, =1 pairs every
// balanced-schedule call that allows it (comparisons and tests; results are the same).
constexpr int64_t kPairMinTiles = 6;
bool v2_pair(const Problem& p) {
  static const int forced = [] {
    const char* v = std::getenv("MLA_SM90_PAIR");
    return v == nullptr ? -1 : std::string(v) == "0" ? 0 : std::string(v) == "1" ? 1 : -1;
  }();
  const int64_t tiles = v1_tiles(p);
  const bool allowed = tiles % 2 == 0 && (p.num_heads == 128 || p.max_q_len == 1);
  if (forced >= 0) return allowed && forced == 1;
  return allowed && tiles >= kPairMinTiles;
}

// Upper bound of the splits per query token, from shapes and the SM count only.
// v0: enough CTAs for two waves, at least kMinKeysPerSplit keys per split, at most kV0MaxSplits.
// v1 (one CTA per SM): as many splits as fit one wave of (tile, request) CTAs, at least one 64-key
// block per split (two for the few-rows kernel). Either way the count is then lowered to the fewest
// splits that keep the same blocks per split for the longest request, so that no split of it is
// left empty (an empty split still costs the combine a partial).
int64_t split_count(const Problem& p, int64_t cap) {
  if (p.num_tokens == 0) return 1;
  const int64_t sms = sm_count(p.device.device_id);
  int64_t splits = 1, max_blocks = 1;
  if (v1_shape_ok(p)) {
    const int64_t ctas = p.batch * v1_tiles(p);
    max_blocks = std::max<int64_t>(1, ceil_div(p.max_seq_len, ::mla::sm90::kBlockKeys));
    // NOTE: the few-rows kernel's two consumers take alternate blocks: a split of one block
    // leaves one of them idle (B1 s8192 H16: 64 splits of 2 blocks 15.3 us, 128 of 1 15.9 us).
    const int64_t min_blocks = rows_shape_ok(p) ? 2 : 1;
    splits =
        std::clamp<int64_t>(sms / ctas, 1, std::min(ceil_div(max_blocks, min_blocks), kMaxSplits));
  } else {
    const int64_t head_groups = ceil_div(p.num_heads, simt::kHeadsPerCta);
    const int64_t want = ceil_div(2 * sms, p.num_tokens * head_groups);
    const int64_t key_bound = p.sparse ? std::min<int64_t>(p.top_k, p.max_seq_len) : p.max_seq_len;
    const int64_t cap = std::max<int64_t>(1, ceil_div(key_bound, kMinKeysPerSplit));
    splits = std::clamp<int64_t>(want, 1, std::min(cap, kV0MaxSplits));
    max_blocks = std::max<int64_t>(1, ceil_div(key_bound, ::mla::sm90::kBlockKeys));
  }
  if (max_splits_override() > 0) splits = std::min(splits, max_splits_override());
  splits = std::max<int64_t>(1, std::min(splits, cap));
  return ceil_div(max_blocks, ceil_div(max_blocks, splits));
}

// Partial rows hold either layout: uniform [splits, T, H] (v0, the few-rows kernel, v2's direct
// split) or the balanced schedule's segments (v2). One split writes no partial row: the decode
// kernel writes out and lse itself. On the schedule only requests of two or more segments have
// partial rows (schedule.cu), and each such request spans at least one of the parts - 1 part
// boundaries, which each cut one request: at most 2 (parts - 1) segments of at most max_q_len x H
// rows, and never more than T x H + (parts - 1) x max_q_len x H.
struct Layout {
  int64_t splits = 1;
  int64_t rows = 0;        // partial rows
  bool scheduled = false;  // v2's route: plan() writes the schedule
  bool direct = false;     // v2's direct split (uniform layout, no schedule)
  int64_t parts = 0;
  int64_t max_offset = 0, sum_offset = 0, o_offset = 0;
  int64_t requests_offset = 0, tokens_offset = 0, part_first_offset = 0, part_blocks_offset = 0;
  int64_t bytes = 0;
};

// The layout with at most `cap` splits (parts of the balanced schedule).
Layout layout_with(const Problem& p, int64_t cap) {
  Layout l;
  if (p.batch == 0) return l;
  l.splits = split_count(p, cap);
  l.direct = p.num_tokens > 0 && v2_direct(p);
  l.scheduled = p.num_tokens > 0 && v2_shape_ok(p) && !l.direct;
  int64_t rows = 0;
  if (l.scheduled) {
    l.parts = std::min(schedule_parts(p), cap);
    const int64_t cut = l.parts - 1;
    rows = std::min(p.num_tokens + cut * p.max_q_len, 2 * cut * p.max_q_len) * p.num_heads;
  } else if (l.splits > 1) {
    rows = l.splits * p.num_tokens * p.num_heads;
  }
  l.rows = rows;
  l.max_offset = kAlign;  // after the checked mode's record
  l.sum_offset = l.max_offset + align_up(rows * 4);
  l.o_offset = l.sum_offset + align_up(rows * 4);
  l.bytes = l.o_offset + align_up(rows * p.L * 2);  // bf16 or fp16: the out type
  if (l.scheduled) {
    l.requests_offset = l.bytes;
    l.tokens_offset =
        l.requests_offset + align_up(p.batch * sizeof(::mla::sm90::schedule::Request));
    l.part_first_offset =
        l.tokens_offset + align_up(p.num_tokens * sizeof(::mla::sm90::schedule::Token));
    l.part_blocks_offset = l.part_first_offset + align_up(l.parts * 4);
    l.bytes = l.part_blocks_offset + kAlign;
  }
  return l;
}

// The contract caps the workspace at 128 MiB (FlashInfer's documented buffer): where the
// preferred split's partials do not fit, the splits (parts) halve until they do. One split (one
// part) writes no partial row, so the loop ends.
constexpr int64_t kWorkspaceCap = int64_t{128} << 20;
Layout layout_of(const Problem& p) {
  int64_t cap = std::max<int64_t>(kMaxSplits, ::mla::sm90::schedule::kMaxParts);
  Layout l = layout_with(p, cap);
  while (l.bytes > kWorkspaceCap && cap > 1) {
    cap /= 2;
    l = layout_with(p, cap);
  }
  return l;
}

Elem elem_of(DataType t) {
  if (t == dtype::kBFloat16) return Elem::kBf16;
  if (t == dtype::kFloat16) return Elem::kFp16;
  return Elem::kFp8E4M3;  // validate() admits no other dtype on this backend
}

int log2_exact(int64_t v) {
  int s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}

// ---- checked mode ----

std::string str(int64_t v) { return std::to_string(v); }

template <typename T>
T read_one(const void* base, int64_t index) {
  T value{};
  MLA_CUDA_CHECK(
      cudaMemcpy(&value, static_cast<const T*>(base) + index, sizeof(T), cudaMemcpyDeviceToHost),
      "reading an index entry back");
  return value;
}

// "name[b][i]" for [B, q_len, ...] tensors, "name[t]" for ragged [T, ...] ones.
std::string token_entry(const char* name, const Problem& p, int64_t t) {
  if (p.ragged) return std::string(name) + "[" + str(t) + "]";
  return std::string(name) + "[" + str(t / p.q_len) + "][" + str(t % p.q_len) + "]";
}

[[noreturn]] void report_bad_index(const Problem& p, const DecodeParams& prm,
                                   unsigned long long key) {
  const auto kind = static_cast<IndexCheck>(key >> ::mla::sm90::kIndexCheckShift);
  const int64_t k = static_cast<int64_t>(key & ((1ull << ::mla::sm90::kIndexCheckShift) - 1));
  std::string msg;
  switch (kind) {
    case IndexCheck::kSeqLens: {
      const int64_t len = read_one<int32_t>(prm.seq_lens.data, k * prm.seq_lens.strides[0]);
      msg = "seq_lens[" + str(k) + "]: " + str(len);
      if (len < 0) {
        msg += " is negative";
      } else if (len > p.max_seq_len) {
        msg += " exceeds max_seq_len " + str(p.max_seq_len);
      } else {
        msg += " exceeds the block_tables capacity " + str(p.max_pages * p.page_size) + " (" +
               str(p.max_pages) + " pages of " + str(p.page_size) + ")";
      }
      break;
    }
    case IndexCheck::kCumSeqLensQ: {
      const void* cum = prm.cum_seq_lens_q.data;
      if (k == 0) {
        msg = "cum_seq_lens_q[0]: expected 0, got " + str(read_one<int32_t>(cum, 0));
      } else if (k <= p.batch) {
        const int64_t lo = read_one<int32_t>(cum, k - 1), hi = read_one<int32_t>(cum, k);
        const int64_t n = hi - lo;
        msg = "cum_seq_lens_q[" + str(k) + "]: ";
        if (n < 0) {
          msg += str(hi) + " is less than cum_seq_lens_q[" + str(k - 1) + "] = " + str(lo) +
                 " (must be non-decreasing)";
        } else if (n > p.max_q_len) {
          msg += "request " + str(k - 1) + " has " + str(n) +
                 " query tokens, more than max_q_len " + str(p.max_q_len);
        } else {
          msg += "request " + str(k - 1) + " has " + str(n) + " query tokens, more than the " +
                 str(p.mask_words * 32) + " bits of a mask row (" + str(p.mask_words) +
                 " uint32 words)";
        }
      } else {
        msg = "cum_seq_lens_q[" + str(p.batch) + "]: expected the query token count " +
              str(p.num_tokens) + ", got " + str(read_one<int32_t>(cum, p.batch));
      }
      break;
    }
    case IndexCheck::kBlockTables: {
      const int64_t b = k / p.max_pages, page = k % p.max_pages;
      const int64_t id = read_one<int32_t>(prm.block_tables.data, b * p.block_table_stride + page);
      msg = "block_tables[" + str(b) + (p.kv_page_tables ? "][0][" : "][") + str(page) +
            "]: page id " + str(id) + " out of range [0, " + str(p.num_pages) + ")";
      break;
    }
    case IndexCheck::kKvPageTables: {
      const int64_t b = k / p.max_pages, page = k % p.max_pages;
      const int64_t row0 = b * p.block_table_stride + page;
      const int64_t id0 = read_one<int32_t>(prm.block_tables.data, row0);
      const int64_t id1 = read_one<int32_t>(prm.block_tables.data, row0 + p.block_table_kv_stride);
      msg = "block_tables[" + str(b) + "][1][" + str(page) + "]: page id " + str(id1) +
            " differs from block_tables[" + str(b) + "][0][" + str(page) + "] = " + str(id0) +
            " (separate K/V page tables must name the same pages for MLA)";
      break;
    }
    case IndexCheck::kTopkLens: {
      const bool per_request = p.topk_lens_mode == TopkLensMode::kPerRequest;
      const int64_t offset =
          per_request ? k * p.topk_lens.batch
          : p.ragged  ? k * p.topk_lens.token
                      : (k / p.q_len) * p.topk_lens.batch + (k % p.q_len) * p.topk_lens.token;
      const int64_t len = read_one<int32_t>(prm.sparse_topk_lens.data, offset);
      msg = (per_request ? "sparse_topk_lens[" + str(k) + "]"
                         : token_entry("sparse_topk_lens", p, k)) +
            ": " + str(len) + " out of range [0, " + str(p.top_k) + "]";
      break;
    }
    case IndexCheck::kSparseIndices: {
      const int64_t t = k / p.top_k, e = k % p.top_k;
      const int64_t offset = p.ragged ? t * p.sparse_indices.token
                                      : (t / p.q_len) * p.sparse_indices.batch +
                                            (t % p.q_len) * p.sparse_indices.token;
      const int64_t slot = read_one<int32_t>(prm.sparse_indices.data, offset + e);
      msg = token_entry("sparse_indices", p, t) + "[" + str(e) + "]: slot " + str(slot) +
            " out of range [-1, " + str(p.num_pages * p.page_size) + ")";
      break;
    }
    default:
      msg = "index check: unknown record " + str(static_cast<int64_t>(key));
  }
  throw Error(ErrorCode::kBadIndex, msg);
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
  k.sched_requests =
      reinterpret_cast<const ::mla::sm90::schedule::Request*>(workspace + layout.requests_offset);
  k.sched_tokens =
      reinterpret_cast<const ::mla::sm90::schedule::Token*>(workspace + layout.tokens_offset);
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
  k.block_table_stride = p.block_table_stride;
  k.bmm1_scale = prm.bmm1_scale;
  k.bmm2_scale = prm.bmm2_scale;
  k.skip_softmax_factor = p.skip_softmax_factor;
  return k;
}

// Launches the decode kernel; `k` is the call's parameters in the uniform layout, to which the
// balanced schedule's pieces are added where v2 runs (the combine then reads them too).
cudaError_t launch_split_kv(const Problem& p, const Layout& layout, Elem q, Elem kv,
                            DecodeKernelParams& k, uint8_t* workspace, cudaStream_t stream,
                            bool pdl) {
  // The TMA kernels where the call fits them (see the routing note at the top of this file).
  const bool aligned =
      reinterpret_cast<uintptr_t>(k.query) % 16 == 0 && reinterpret_cast<uintptr_t>(k.kv) % 16 == 0;
  if (q == kv && (q == Elem::kBf16 || q == Elem::kFp16) && aligned &&
      (rows_shape_ok(p) || layout.scheduled || layout.direct)) {
    CUtensorMap kv_map;
    if (tma::make_kv_tensor_map(k, kv, &kv_map) == cudaSuccess) {
      // NOTE: with at most 32 query rows per request, v2's 64-row tiles are mostly padding and
      // the few-rows kernel does a quarter to a half of the tensor work (docs/perf-notes.md).
      if (rows_shape_ok(p)) {
        k.direct_out = k.num_splits == 1 ? 1 : 0;  // one split: out and lse without a combine
        if (p.max_q_len * p.num_heads <= 16) {
          return q == Elem::kBf16
                     ? few_rows::launch_few_rows<Elem::kBf16, 16>(k, kv_map, stream, pdl)
                     : few_rows::launch_few_rows<Elem::kFp16, 16>(k, kv_map, stream, pdl);
        }
        return q == Elem::kBf16
                   ? few_rows::launch_few_rows<Elem::kBf16, 32>(k, kv_map, stream, pdl)
                   : few_rows::launch_few_rows<Elem::kFp16, 32>(k, kv_map, stream, pdl);
      }
      if (layout.direct) {
        k.direct_out = k.num_splits == 1 ? 1 : 0;  // one run: out and lse without a combine
      } else {
        schedule_view(layout, workspace, p.batch, k);
      }
      const int tiles = static_cast<int>(v1_tiles(p));
      const bool pair = v2_pair(p);  // the launch runs the direct split unpaired
      // Rows of a 64-row tile that attend the draft keys unequally: a custom mask, or tiles that
      // span two tokens.
      const bool clean = p.has_mask || (p.max_q_len > 1 && p.num_heads % tma::kTileRows != 0);
      return q == Elem::kBf16 ? seesaw::launch_seesaw<Elem::kBf16>(k, kv_map, tiles, layout.direct,
                                                                   pair, clean, stream, pdl)
                              : seesaw::launch_seesaw<Elem::kFp16>(k, kv_map, tiles, layout.direct,
                                                                   pair, clean, stream, pdl);
    }
  }
  // v0. A call laid out for the balanced schedule whose data addresses turned out unfit for TMA
  // has no uniform partial rows: it runs as one split.
  if (layout.scheduled) k.num_splits = 1;
  k.direct_out = k.num_splits == 1 ? 1 : 0;  // one split: out and lse without a combine
  if (q == Elem::kBf16 && kv == Elem::kBf16) {
    return simt::launch_simt<Elem::kBf16, Elem::kBf16>(k, stream, pdl);
  }
  if (q == Elem::kFp16 && kv == Elem::kFp16) {
    return simt::launch_simt<Elem::kFp16, Elem::kFp16>(k, stream, pdl);
  }
  if (q == Elem::kFp8E4M3 && kv == Elem::kFp8E4M3) {
    return simt::launch_simt<Elem::kFp8E4M3, Elem::kFp8E4M3>(k, stream, pdl);
  }
  if (q == Elem::kBf16 && kv == Elem::kFp8E4M3) {
    return simt::launch_simt<Elem::kBf16, Elem::kFp8E4M3>(k, stream, pdl);
  }
  if (q == Elem::kBf16 && kv == Elem::kFp8DsMla) {
    return simt::launch_simt<Elem::kBf16, Elem::kFp8DsMla>(k, stream, pdl);
  }
  MLA_FAIL(ErrorCode::kUnsupported, "backend sm90: no kernel for this (query, kv_cache) pair");
}

}  // namespace

void check_device(Device device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    MLA_FAIL(ErrorCode::kUnsupported,
             "backend: sm90 is not available: no CUDA device found for "
                 << device_str(device) << " (cudaGetDeviceCount: "
                 << (err != cudaSuccess
                         ? std::string(cudaGetErrorName(err)) + ", " + cudaGetErrorString(err)
                         : std::string("0 devices"))
                 << ")");
  }
  const int id = device.device_id;
  MLA_CHECK_ARG(
      id >= 0 && id < count, ErrorCode::kDeviceError,
      "query: expected a CUDA device id in [0, " << count << "), got " << device_str(device));
  int cc = id < kMaxDevices ? g_cc[id].load() : 0;
  if (cc == 0) {
    int major = 0, minor = 0;
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, id),
                   "cudaDeviceGetAttribute(ComputeCapabilityMajor, " << id << ")");
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, id),
                   "cudaDeviceGetAttribute(ComputeCapabilityMinor, " << id << ")");
    cc = major * 10 + minor;
    if (id < kMaxDevices) g_cc[id].store(cc);
  }
  if (cc != 90) {
    cudaDeviceProp prop{};
    std::string name = "unknown";
    if (cudaGetDeviceProperties(&prop, id) == cudaSuccess) name = prop.name;
    MLA_FAIL(ErrorCode::kUnsupported,
             "backend: sm90 needs a compute capability 9.0 (Hopper) GPU, but "
                 << device_str(device) << " is " << name << " with compute capability " << cc / 10
                 << "." << cc % 10 << "; no other GPU backend is available");
  }
}

size_t workspace_size(const Problem& problem) {
  DeviceGuard guard(problem.device.device_id);
  return static_cast<size_t>(layout_of(problem).bytes);
}

void plan(const Problem& p, const DecodeParams& prm) {
  // v0 and the few-rows kernel derive each CTA's key range from seq_lens on the device; v2's
  // balanced schedule is written into the workspace here.
  if (p.batch == 0) return;
  DeviceGuard guard(p.device.device_id);
  const Layout layout = layout_of(p);
  if (!layout.scheduled) return;
  auto* workspace = static_cast<uint8_t*>(prm.workspace.data);
  DecodeKernelParams k = kernel_params(p, prm, workspace, layout);
  schedule_view(layout, workspace, p.batch, k);
  schedule::Outputs out;
  out.requests =
      reinterpret_cast<::mla::sm90::schedule::Request*>(workspace + layout.requests_offset);
  out.tokens = reinterpret_cast<::mla::sm90::schedule::Token*>(workspace + layout.tokens_offset);
  out.part_first = reinterpret_cast<int32_t*>(workspace + layout.part_first_offset);
  out.part_blocks = reinterpret_cast<int32_t*>(workspace + layout.part_blocks_offset);
  const int max_blocks = static_cast<int>(ceil_div(p.max_seq_len, ::mla::sm90::kBlockKeys));
  MLA_CUDA_CHECK(schedule::launch_schedule(k, out, static_cast<int>(p.max_q_len), max_blocks,
                                           static_cast<int>(schedule_fixed_blocks()), layout.rows,
                                           static_cast<cudaStream_t>(prm.stream), prm.enable_pdl),
                 "launching the schedule kernel");
}

void run(const Problem& p, const DecodeParams& prm) {
  if (p.batch == 0) return;
  DeviceGuard guard(p.device.device_id);
  const auto stream = static_cast<cudaStream_t>(prm.stream);
  auto* workspace = static_cast<uint8_t*>(prm.workspace.data);
  const Layout layout = layout_of(p);
  if (prm.validate_indices) check_indices(p, prm, workspace, stream);
  if (p.num_tokens == 0) return;

  DecodeKernelParams k = kernel_params(p, prm, workspace, layout);
  const Elem kv = p.kv_format == KvFormat::kFp8DsMla ? Elem::kFp8DsMla : elem_of(p.kv_dtype);
  MLA_CUDA_CHECK(
      launch_split_kv(p, layout, elem_of(p.q_dtype), kv, k, workspace, stream, prm.enable_pdl),
      "launching the split-KV decode kernel");
  if (k.direct_out) return;  // the decode kernel wrote out and lse
  const int sms = sm_count(p.device.device_id);
  const cudaError_t err =
      p.out_dtype == dtype::kBFloat16
          ? combine::launch_combine<Elem::kBf16>(k, sms, stream, prm.enable_pdl)
          : combine::launch_combine<Elem::kFp16>(k, sms, stream, prm.enable_pdl);
  MLA_CUDA_CHECK(err, "launching the combine kernel");
}

}  // namespace mla::detail::sm90
