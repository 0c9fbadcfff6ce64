// Host-side validation of every docs/contract.md section 5 rule that needs no look at device
// memory.
#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "host/backends.h"
#include "host/check.h"

namespace mla::detail {
namespace {

bool is_host(Device d) {
  return d.device_type == static_cast<int32_t>(DeviceType::kCPU) ||
         d.device_type == static_cast<int32_t>(DeviceType::kCUDAHost);
}
bool is_cuda(Device d) { return d.device_type == static_cast<int32_t>(DeviceType::kCUDA); }

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// a * b for non-negative sizes, saturated at INT64_MAX so that huge shapes cannot wrap around.
int64_t mul_sat(int64_t a, int64_t b) { return a != 0 && b > INT64_MAX / a ? INT64_MAX : a * b; }

// a + b for non-negative sizes, saturated like mul_sat.
int64_t add_sat(int64_t a, int64_t b) { return b > INT64_MAX - a ? INT64_MAX : a + b; }

// Element count of a view with non-negative sizes, saturated like mul_sat (TensorView::numel
// wraps).
int64_t numel_sat(const TensorView& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n = mul_sat(n, t.shape[d]);
  return n;
}

}  // namespace

void check_tensor(const TensorView& t, const char* name, Device device) {
  MLA_CHECK_ARG(
      t.ndim >= 0 && t.ndim <= TensorView::kMaxDims, ErrorCode::kInvalidArgument,
      name << ": expected rank at most " << TensorView::kMaxDims << ", got rank " << t.ndim);
  for (int d = 0; d < t.ndim; ++d) {
    MLA_CHECK_ARG(t.shape[d] >= 0, ErrorCode::kInvalidArgument,
                  name << ": expected non-negative sizes, got shape " << shape_str(t));
    MLA_CHECK_ARG(t.strides[d] >= 0, ErrorCode::kInvalidArgument,
                  name << ": expected non-negative strides, got strides " << strides_str(t));
  }
  MLA_CHECK_ARG(numel_sat(t) == 0 || t.data != nullptr, ErrorCode::kInvalidArgument,
                name << ": expected a data pointer for shape " << shape_str(t) << ", got null");
  MLA_CHECK_ARG(t.device == device, ErrorCode::kDeviceError,
                name << ": expected device " << device_str(device) << " (the query's), got "
                     << device_str(t.device));
}

namespace {

void check_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  MLA_CHECK_ARG(t.ndim == rank, ErrorCode::kInvalidArgument,
                name << ": expected rank " << rank << " " << layout << ", got rank " << t.ndim
                     << " with shape " << shape_str(t));
}

void check_dtype(const TensorView& t, const char* name, DataType expected) {
  MLA_CHECK_ARG(
      t.dtype == expected, ErrorCode::kTypeError,
      name << ": expected dtype " << dtype_str(expected) << ", got " << dtype_str(t.dtype));
}

void check_dim(const TensorView& t, const char* name, int dim, int64_t expected,
               const std::string& what) {
  MLA_CHECK_ARG(t.shape[dim] == expected, ErrorCode::kInvalidArgument,
                name << ": expected " << what << " " << expected << ", got " << t.shape[dim]
                     << " (shape " << shape_str(t) << ")");
}

void check_last_contiguous(const TensorView& t, const char* name) {
  if (t.ndim == 0) return;
  MLA_CHECK_ARG(
      t.shape[t.ndim - 1] <= 1 || t.strides[t.ndim - 1] == 1, ErrorCode::kInvalidArgument,
      name << ": expected a contiguous last dim (stride 1), got strides " << strides_str(t));
}

bool is_16bit_float(DataType t) { return t == dtype::kBFloat16 || t == dtype::kFloat16; }

// A uint8 kv_cache holds the fp8_ds_mla format (docs/contract.md section 1).
void check_input_dtypes(const TensorView& query, const TensorView& kv, Backend backend) {
  const DataType q = query.dtype, k = kv.dtype;
  const bool q_ok = is_16bit_float(q) || q == dtype::kFloat8E4M3 ||
                    (backend == Backend::kCpu && q == dtype::kFloat32);
  MLA_CHECK_ARG(q_ok, ErrorCode::kTypeError,
                "query: expected dtype bfloat16, float16 or float8_e4m3fn"
                    << (backend == Backend::kCpu ? " (cpu backend: also float32)" : "") << ", got "
                    << dtype_str(q));
  const bool k_ok = is_16bit_float(k) || k == dtype::kFloat8E4M3 || k == dtype::kUInt8 ||
                    (backend == Backend::kCpu && k == dtype::kFloat32);
  MLA_CHECK_ARG(k_ok, ErrorCode::kTypeError,
                "kv_cache: expected dtype bfloat16, float16 or float8_e4m3fn"
                    << (backend == Backend::kCpu ? " (cpu backend: also float32)" : "")
                    << ", or uint8 (the fp8_ds_mla format), got " << dtype_str(k));
  const bool pair_ok = q == k || (q == dtype::kBFloat16 && k == dtype::kFloat8E4M3) ||
                       (q == dtype::kBFloat16 && k == dtype::kUInt8);
  MLA_CHECK_ARG(pair_ok, ErrorCode::kTypeError,
                "kv_cache: expected a dtype pair (query, kv_cache) of (bfloat16, bfloat16), "
                "(float16, float16), (float8_e4m3fn, float8_e4m3fn), (bfloat16, float8_e4m3fn), "
                "(bfloat16, uint8 fp8_ds_mla)"
                    << (backend == Backend::kCpu ? " or (float32, float32)" : "") << ", got ("
                    << dtype_str(q) << ", " << dtype_str(k) << ")");
}

Backend resolve_backend(Backend requested, Device device) {
  switch (requested) {
    case Backend::kAuto:
      if (is_host(device)) return Backend::kCpu;
      if (is_cuda(device)) return Backend::kSm90;
      break;
    case Backend::kCpu:
      MLA_CHECK_ARG(is_host(device), ErrorCode::kDeviceError,
                    "query: backend cpu expects host tensors, got device " << device_str(device));
      return Backend::kCpu;
    case Backend::kSm90:
      MLA_CHECK_ARG(is_cuda(device), ErrorCode::kDeviceError,
                    "query: backend sm90 expects CUDA tensors, got device " << device_str(device));
      return Backend::kSm90;
    default:
      MLA_FAIL(ErrorCode::kInvalidArgument, "backend: expected auto, sm90 or cpu, got enum value "
                                                << static_cast<int>(requested));
  }
  MLA_FAIL(ErrorCode::kDeviceError,
           "query: expected a host (cpu) or CUDA tensor, got device " << device_str(device));
}

// Per-backend limits, after the contract-wide checks.
void check_backend_support(const Problem& p) {
  if (p.backend == Backend::kSm90) {
    sm90::check_support(p);
    sm90::check_device(p.device);
  }
}

// Scale given either as a host float or as a one-element fp32 tensor. Any value is accepted: a
// NaN or inf scale propagates to the rows it touches (docs/contract.md section 1), as a tensor's
// does. Messages name the tensor "bmm1_scale (tensor)": the argument is bmm1_scale_tensor in C++
// and a tensor passed as bmm1_scale in Python, and the name must make sense in both.
bool check_scale(const TensorView& tensor, const char* tensor_name, Device device) {
  if (!tensor.defined()) return false;
  check_tensor(tensor, tensor_name, device);
  check_dtype(tensor, tensor_name, dtype::kFloat32);
  MLA_CHECK_ARG(numel_sat(tensor) == 1, ErrorCode::kInvalidArgument,
                tensor_name << ": expected exactly 1 element, got shape " << shape_str(tensor));
  return true;
}

// out and lse are written once per element: a zero stride on a dim of size > 1 would write one
// element many times. An empty tensor is written nowhere.
void check_written_once(const TensorView& t, const char* name) {
  if (numel_sat(t) == 0) return;
  for (int d = 0; d < t.ndim; ++d) {
    MLA_CHECK_ARG(t.shape[d] <= 1 || t.strides[d] != 0, ErrorCode::kInvalidArgument,
                  name << ": expected a non-zero stride on every dim of size > 1 (each element "
                          "written once), got strides "
                       << strides_str(t) << " for shape " << shape_str(t));
  }
}

RowStrides token_strides(const TensorView& t, bool ragged, bool has_head_dim) {
  RowStrides s;
  if (ragged) {
    s.token = t.strides[0];
    if (has_head_dim) s.head = t.strides[1];
  } else {
    s.batch = t.strides[0];
    s.token = t.strides[1];
    if (has_head_dim) s.head = t.strides[2];
  }
  return s;
}

}  // namespace

Problem validate(const DecodeParams& prm) {
  Problem p;

  // Query: device, backend, rank.
  MLA_CHECK_ARG(prm.query.defined(), ErrorCode::kInvalidArgument,
                "query: expected a tensor, got none");
  const Device device = prm.query.device;
  check_tensor(prm.query, "query", device);
  p.backend = resolve_backend(prm.backend, device);
  p.device = device;
  p.ragged = prm.cum_seq_lens_q.defined();
  if (p.ragged) {
    check_rank(prm.query, "query", 3, "[T, H, D] (cum_seq_lens_q given)");
  } else {
    check_rank(prm.query, "query", 4, "[B, q_len, H, D]");
  }

  // Head dims.
  MLA_CHECK_ARG(prm.kv_lora_rank > 0, ErrorCode::kInvalidArgument,
                "kv_lora_rank: expected a positive value, got " << prm.kv_lora_rank);
  MLA_CHECK_ARG(prm.qk_rope_head_dim >= 0, ErrorCode::kInvalidArgument,
                "qk_rope_head_dim: expected a non-negative value, got " << prm.qk_rope_head_dim);
  MLA_CHECK_ARG(prm.qk_nope_head_dim > 0, ErrorCode::kInvalidArgument,
                "qk_nope_head_dim: expected a positive value, got " << prm.qk_nope_head_dim);
  MLA_CHECK_ARG(int64_t{prm.kv_lora_rank} + prm.qk_rope_head_dim <= INT32_MAX,
                ErrorCode::kInvalidArgument,
                "qk_rope_head_dim: expected kv_lora_rank + qk_rope_head_dim to fit int32, got "
                    << prm.kv_lora_rank << " + " << prm.qk_rope_head_dim << " = "
                    << int64_t{prm.kv_lora_rank} + prm.qk_rope_head_dim);
  p.L = prm.kv_lora_rank;
  p.R = prm.qk_rope_head_dim;
  p.D = p.L + p.R;
  std::ostringstream d_what;
  d_what << "last dim (kv_lora_rank " << p.L << " + qk_rope_head_dim " << p.R << ") =";
  check_dim(prm.query, "query", prm.query.ndim - 1, p.D, d_what.str());
  check_last_contiguous(prm.query, "query");

  // KV cache.
  MLA_CHECK_ARG(prm.kv_cache.defined(), ErrorCode::kInvalidArgument,
                "kv_cache: expected a tensor, got none");
  check_tensor(prm.kv_cache, "kv_cache", device);
  MLA_CHECK_ARG(prm.kv_cache.ndim == 3 || prm.kv_cache.ndim == 4, ErrorCode::kInvalidArgument,
                "kv_cache: expected rank 3 [P, page_size, D] or 4 [P, 1, page_size, D], got rank "
                    << prm.kv_cache.ndim << " with shape " << shape_str(prm.kv_cache));
  const int kv_row_dim = prm.kv_cache.ndim - 2;
  if (prm.kv_cache.ndim == 4) check_dim(prm.kv_cache, "kv_cache", 1, 1, "dim 1 (heads) =");
  check_input_dtypes(prm.query, prm.kv_cache, p.backend);
  if (prm.kv_cache.dtype == dtype::kUInt8) {
    // fp8_ds_mla: 656 bytes per token hold D = 576 values (docs/contract.md section 1).
    MLA_CHECK_ARG(p.L == 512 && p.R == 64, ErrorCode::kInvalidArgument,
                  "kv_cache: expected kv_lora_rank 512 and qk_rope_head_dim 64 with a uint8 "
                  "(fp8_ds_mla) cache, got kv_lora_rank "
                      << p.L << " and qk_rope_head_dim " << p.R);
    check_dim(prm.kv_cache, "kv_cache", prm.kv_cache.ndim - 1, kDsMlaRowBytes,
              "last dim of fp8_ds_mla bytes per token (512 float8_e4m3fn values, 4 float32 "
              "scales, 64 bfloat16 rope values) =");
    p.kv_format = KvFormat::kFp8DsMla;
  } else {
    check_dim(prm.kv_cache, "kv_cache", prm.kv_cache.ndim - 1, p.D, d_what.str());
  }
  check_last_contiguous(prm.kv_cache, "kv_cache");
  p.q_dtype = prm.query.dtype;
  p.kv_dtype = prm.kv_cache.dtype;
  p.num_pages = prm.kv_cache.shape[0];
  p.page_size = prm.kv_cache.shape[kv_row_dim];
  MLA_CHECK_ARG(is_pow2(p.page_size), ErrorCode::kInvalidArgument,
                "kv_cache: expected page_size (dim " << kv_row_dim << ") to be a power of two, got "
                                                     << p.page_size);
  p.kv_page_stride = prm.kv_cache.strides[0];
  p.kv_row_stride = prm.kv_cache.strides[kv_row_dim];

  // Batch and query tokens.
  MLA_CHECK_ARG(prm.seq_lens.defined(), ErrorCode::kInvalidArgument,
                "seq_lens: expected a tensor, got none");
  check_tensor(prm.seq_lens, "seq_lens", device);
  check_rank(prm.seq_lens, "seq_lens", 1, "[B]");
  check_dtype(prm.seq_lens, "seq_lens", dtype::kInt32);
  check_last_contiguous(prm.seq_lens, "seq_lens");
  p.num_heads = prm.query.shape[prm.query.ndim - 2];
  MLA_CHECK_ARG(p.num_heads >= 1, ErrorCode::kInvalidArgument,
                "query: expected at least 1 head (dim " << prm.query.ndim - 2 << "), got shape "
                                                        << shape_str(prm.query));
  if (p.ragged) {
    p.batch = prm.seq_lens.shape[0];
    p.num_tokens = prm.query.shape[0];
    // cum_seq_lens_q holds B + 1 int32 offsets: B + 1 must fit int32 (and cannot overflow).
    MLA_CHECK_ARG(p.batch < INT32_MAX, ErrorCode::kInvalidArgument,
                  "seq_lens: expected at most 2^31 - 2 requests (B) with cum_seq_lens_q, whose B + "
                  "1 entries are indexed in int32, got B = "
                      << p.batch);
    check_tensor(prm.cum_seq_lens_q, "cum_seq_lens_q", device);
    check_rank(prm.cum_seq_lens_q, "cum_seq_lens_q", 1, "[B + 1]");
    check_dtype(prm.cum_seq_lens_q, "cum_seq_lens_q", dtype::kInt32);
    check_dim(prm.cum_seq_lens_q, "cum_seq_lens_q", 0, p.batch + 1,
              "length B + 1 (B from seq_lens) =");
    check_last_contiguous(prm.cum_seq_lens_q, "cum_seq_lens_q");
    // 0 bounds the lengths of a call without query tokens (T = 0, a no-op), and no other.
    MLA_CHECK_ARG(
        prm.max_q_len == -1 || prm.max_q_len >= 1 || (prm.max_q_len == 0 && p.num_tokens == 0),
        ErrorCode::kInvalidArgument,
        "max_q_len: expected -1 (unknown) or an upper bound of the query lengths (at least 1 "
        "when the query has tokens, 0 allowed without), got "
            << prm.max_q_len << " with " << p.num_tokens << " query tokens");
    p.max_q_len = prm.max_q_len == -1 ? p.num_tokens : prm.max_q_len;
  } else {
    p.batch = prm.query.shape[0];
    p.q_len = prm.query.shape[1];
    // q_len 0 leaves the call without query tokens (T = 0): a no-op, as in the ragged layout.
    p.num_tokens = mul_sat(p.batch, p.q_len);
    check_dim(prm.seq_lens, "seq_lens", 0, p.batch, "length B (query dim 0) =");
    MLA_CHECK_ARG(prm.max_q_len == -1 || prm.max_q_len == p.q_len, ErrorCode::kInvalidArgument,
                  "max_q_len: expected -1 or q_len " << p.q_len << " for dense queries, got "
                                                     << prm.max_q_len);
    p.max_q_len = p.q_len;
  }
  p.q = token_strides(prm.query, p.ragged, true);

  // Index math is int32 on the device: sizes must fit.
  MLA_CHECK_ARG(mul_sat(p.num_pages, p.page_size) <= INT32_MAX, ErrorCode::kInvalidArgument,
                "kv_cache: expected at most 2^31 - 1 token slots (P * page_size) for int32 "
                "indices, got "
                    << p.num_pages << " * " << p.page_size << " = "
                    << mul_sat(p.num_pages, p.page_size));
  MLA_CHECK_ARG(mul_sat(p.num_tokens, p.num_heads) <= INT32_MAX, ErrorCode::kInvalidArgument,
                "query: expected at most 2^31 - 1 query rows (tokens * H) for int32 indices, got "
                    << p.num_tokens << " * " << p.num_heads << " = "
                    << mul_sat(p.num_tokens, p.num_heads));

  // Mode: dense (block_tables) or sparse (sparse_indices).
  MLA_CHECK_ARG(prm.sparse_top_k >= 0, ErrorCode::kInvalidArgument,
                "sparse_top_k: expected 0 (dense) or a positive top-k, got " << prm.sparse_top_k);
  p.sparse = prm.sparse_top_k > 0;
  p.top_k = prm.sparse_top_k;
  if (p.sparse) {
    MLA_CHECK_ARG(!prm.block_tables.defined(), ErrorCode::kInvalidArgument,
                  "block_tables: expected none in sparse mode (sparse_top_k "
                      << prm.sparse_top_k
                      << "): sparse indices address the pool directly; pass them as "
                         "sparse_indices, got shape "
                      << shape_str(prm.block_tables));
    MLA_CHECK_ARG(
        !prm.mask.defined(), ErrorCode::kInvalidArgument,
        "mask: expected none in sparse mode (sparse_top_k " << prm.sparse_top_k << "), got a mask");
    MLA_CHECK_ARG(prm.sparse_indices.defined(), ErrorCode::kInvalidArgument,
                  "sparse_indices: expected a tensor when sparse_top_k is " << prm.sparse_top_k
                                                                            << ", got none");
    const TensorView& si = prm.sparse_indices;
    check_tensor(si, "sparse_indices", device);
    if (p.ragged) {
      check_rank(si, "sparse_indices", 2, "[T, top_k]");
      check_dim(si, "sparse_indices", 0, p.num_tokens, "T (query dim 0) =");
    } else {
      check_rank(si, "sparse_indices", 3, "[B, q_len, top_k]");
      check_dim(si, "sparse_indices", 0, p.batch, "B (query dim 0) =");
      check_dim(si, "sparse_indices", 1, p.q_len, "q_len (query dim 1) =");
    }
    check_dim(si, "sparse_indices", si.ndim - 1, p.top_k, "last dim sparse_top_k =");
    check_dtype(si, "sparse_indices", dtype::kInt32);
    check_last_contiguous(si, "sparse_indices");
    p.sparse_indices = token_strides(si, p.ragged, false);

    const TensorView& tl = prm.sparse_topk_lens;
    if (tl.defined()) {
      check_tensor(tl, "sparse_topk_lens", device);
      check_dtype(tl, "sparse_topk_lens", dtype::kInt32);
      if (p.ragged) {
        check_rank(tl, "sparse_topk_lens", 1, "[T] (per query token, cum_seq_lens_q given)");
        check_dim(tl, "sparse_topk_lens", 0, p.num_tokens, "T (query dim 0) =");
        p.topk_lens_mode = TopkLensMode::kPerToken;
        p.topk_lens.token = tl.strides[0];
      } else if (tl.ndim == 1) {
        check_dim(tl, "sparse_topk_lens", 0, p.batch, "B (per request) =");
        p.topk_lens_mode = TopkLensMode::kPerRequest;
        p.topk_lens.batch = tl.strides[0];
      } else {
        check_rank(tl, "sparse_topk_lens", 2, "[B, q_len] (per token) or [B] (per request)");
        check_dim(tl, "sparse_topk_lens", 0, p.batch, "B (query dim 0) =");
        check_dim(tl, "sparse_topk_lens", 1, p.q_len, "q_len (query dim 1) =");
        p.topk_lens_mode = TopkLensMode::kPerToken;
        p.topk_lens.batch = tl.strides[0];
        p.topk_lens.token = tl.strides[1];
      }
    }
    MLA_CHECK_ARG(
        prm.max_seq_len >= -1, ErrorCode::kInvalidArgument,
        "max_seq_len: expected -1 (unknown) or a non-negative bound, got " << prm.max_seq_len);
    p.max_seq_len = prm.max_seq_len == -1 ? INT32_MAX : prm.max_seq_len;
  } else {
    MLA_CHECK_ARG(!prm.sparse_indices.defined(), ErrorCode::kInvalidArgument,
                  "sparse_indices: expected none in dense mode (sparse_top_k 0), got shape "
                      << shape_str(prm.sparse_indices));
    MLA_CHECK_ARG(!prm.sparse_topk_lens.defined(), ErrorCode::kInvalidArgument,
                  "sparse_topk_lens: expected none in dense mode (sparse_top_k 0), got shape "
                      << shape_str(prm.sparse_topk_lens));
    MLA_CHECK_ARG(prm.block_tables.defined(), ErrorCode::kInvalidArgument,
                  "block_tables: expected a tensor in dense mode, got none");
    const TensorView& bt = prm.block_tables;
    check_tensor(bt, "block_tables", device);
    MLA_CHECK_ARG(bt.ndim == 2 || bt.ndim == 3, ErrorCode::kInvalidArgument,
                  "block_tables: expected rank 2 [B, max_pages] or 3 [B, 2, max_pages] (separate "
                  "K and V page tables), got rank "
                      << bt.ndim << " with shape " << shape_str(bt));
    check_dtype(bt, "block_tables", dtype::kInt32);
    check_dim(bt, "block_tables", 0, p.batch, "B =");
    if (bt.ndim == 3) {
      check_dim(bt, "block_tables", 1, 2, "dim 1 (the K and V page tables) =");
      p.kv_page_tables = true;
      p.block_table_kv_stride = bt.strides[1];
    }
    check_last_contiguous(bt, "block_tables");
    p.max_pages = bt.shape[bt.ndim - 1];
    p.block_table_stride = bt.strides[0];
    const int64_t capacity = mul_sat(p.max_pages, p.page_size);
    MLA_CHECK_ARG(capacity <= INT32_MAX, ErrorCode::kInvalidArgument,
                  "block_tables: expected max_pages * page_size to fit int32 token positions, got "
                      << p.max_pages << " * " << p.page_size << " = " << capacity);
    MLA_CHECK_ARG(prm.max_seq_len >= -1 && prm.max_seq_len <= capacity, ErrorCode::kInvalidArgument,
                  "max_seq_len: expected -1 (unknown) or a bound in [0, max_pages * page_size = "
                      << capacity << "], got " << prm.max_seq_len);
    p.max_seq_len = prm.max_seq_len == -1 ? capacity : prm.max_seq_len;

    // Custom mask.
    if (prm.mask.defined()) {
      const TensorView& m = prm.mask;
      check_tensor(m, "mask", device);
      const bool u16 = m.dtype == dtype::kUInt16;
      MLA_CHECK_ARG(m.dtype == dtype::kUInt32 || u16, ErrorCode::kTypeError,
                    "mask: expected dtype uint32 (or uint16 with twice the words), got "
                        << dtype_str(m.dtype));
      if (p.ragged) {
        check_rank(m, "mask", 2, "[T, W]");
        check_dim(m, "mask", 0, p.num_tokens, "T (query dim 0) =");
      } else {
        check_rank(m, "mask", 3, "[B, q_len, W]");
        check_dim(m, "mask", 0, p.batch, "B (query dim 0) =");
        check_dim(m, "mask", 1, p.q_len, "q_len (query dim 1) =");
      }
      check_last_contiguous(m, "mask");
      const int64_t words = m.shape[m.ndim - 1];
      MLA_CHECK_ARG(!u16 || words % 2 == 0, ErrorCode::kInvalidArgument,
                    "mask: expected an even number of uint16 words per row (2W), got " << words);
      p.mask_words = u16 ? words / 2 : words;
      // Without a max_q_len hint the ragged lengths are only known on the device, where the
      // index check covers them.
      const int64_t needed = p.ragged && prm.max_q_len == -1 ? 1 : ceil_div(p.max_q_len, 32);
      MLA_CHECK_ARG(p.mask_words >= needed, ErrorCode::kInvalidArgument,
                    "mask: expected at least "
                        << (u16 ? 2 * needed : needed) << (u16 ? " uint16" : " uint32")
                        << " words per row for query length " << p.max_q_len << ", got " << words);
      p.mask = token_strides(m, p.ragged, false);
      p.has_mask = true;
    }
  }

  // Outputs.
  MLA_CHECK_ARG(prm.out.defined(), ErrorCode::kInvalidArgument, "out: expected a tensor, got none");
  check_tensor(prm.out, "out", device);
  MLA_CHECK_ARG(prm.out.ndim == prm.query.ndim, ErrorCode::kInvalidArgument,
                "out: expected rank " << prm.query.ndim << " like query, got rank " << prm.out.ndim
                                      << " with shape " << shape_str(prm.out));
  for (int d = 0; d + 1 < prm.out.ndim; ++d) {
    check_dim(prm.out, "out", d, prm.query.shape[d], "dim " + std::to_string(d) + " like query =");
  }
  check_dim(prm.out, "out", prm.out.ndim - 1, p.L, "last dim kv_lora_rank =");
  MLA_CHECK_ARG(is_16bit_float(prm.out.dtype), ErrorCode::kTypeError,
                "out: expected dtype bfloat16 or float16, got " << dtype_str(prm.out.dtype));
  check_last_contiguous(prm.out, "out");
  check_written_once(prm.out, "out");
  p.out_dtype = prm.out.dtype;
  p.out = token_strides(prm.out, p.ragged, true);

  if (prm.lse.defined()) {
    const TensorView& l = prm.lse;
    check_tensor(l, "lse", device);
    check_dtype(l, "lse", dtype::kFloat32);
    if (p.ragged) {
      check_rank(l, "lse", 2, "[T, H]");
    } else {
      check_rank(l, "lse", 3, "[B, q_len, H]");
    }
    for (int d = 0; d < l.ndim; ++d) {
      check_dim(l, "lse", d, prm.query.shape[d], "dim " + std::to_string(d) + " like query =");
    }
    check_written_once(l, "lse");
    p.lse = token_strides(l, p.ragged, true);
    p.has_lse = true;
  }

  // Optional per-head sinks and scales.
  if (prm.sinks.defined()) {
    check_tensor(prm.sinks, "sinks", device);
    check_rank(prm.sinks, "sinks", 1, "[H]");
    const DataType st = prm.sinks.dtype;
    MLA_CHECK_ARG(st == dtype::kFloat32 || is_16bit_float(st), ErrorCode::kTypeError,
                  "sinks: expected dtype float32, bfloat16 or float16, got " << dtype_str(st));
    check_dim(prm.sinks, "sinks", 0, p.num_heads, "H (query heads) =");
    check_last_contiguous(prm.sinks, "sinks");
    p.has_sinks = true;
    p.sinks_dtype = st;
  }
  p.has_bmm1_tensor = check_scale(prm.bmm1_scale_tensor, "bmm1_scale (tensor)", device);
  p.has_bmm2_tensor = check_scale(prm.bmm2_scale_tensor, "bmm2_scale (tensor)", device);
  const float f = prm.skip_softmax_threshold_scale_factor;
  MLA_CHECK_ARG(std::isfinite(f) && f >= 0.0f, ErrorCode::kInvalidArgument,
                "skip_softmax_threshold_scale_factor: expected 0 (off) or a finite positive "
                "factor, got "
                    << f);
  p.skip_softmax_factor = f;

  check_backend_support(p);
  return p;
}

namespace {

// Bytes [begin, end) that a tensor's elements span; empty for an undefined or empty tensor.
struct ByteExtent {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  bool empty() const { return begin == end; }
};

ByteExtent byte_extent(const TensorView& t) {
  if (!t.defined() || numel_sat(t) == 0) return {};
  const int64_t element_bytes = (int64_t{t.dtype.bits} * t.dtype.lanes + 7) / 8;
  int64_t last = 0;  // element offset of the last element
  for (int d = 0; d < t.ndim; ++d) last = add_sat(last, mul_sat(t.shape[d] - 1, t.strides[d]));
  const int64_t bytes = add_sat(mul_sat(last, element_bytes), element_bytes);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data);
  const uintptr_t room = UINTPTR_MAX - begin;
  return {begin,
          begin + (static_cast<uint64_t>(bytes) > room ? room : static_cast<uintptr_t>(bytes))};
}

std::string extent_str(const ByteExtent& e) {
  std::ostringstream s;
  s << "[0x" << std::hex << e.begin << ", 0x" << e.end << ")";
  return s.str();
}

struct NamedTensor {
  const char* name;
  const TensorView* tensor;
};

void check_apart(const NamedTensor& output, const NamedTensor& other) {
  if (output.tensor->device != other.tensor->device) return;
  const ByteExtent a = byte_extent(*output.tensor), b = byte_extent(*other.tensor);
  if (a.empty() || b.empty()) return;
  MLA_CHECK_ARG(a.end <= b.begin || b.end <= a.begin, ErrorCode::kInvalidArgument,
                output.name << ": overlaps " << other.name << " (bytes " << extent_str(a) << " and "
                            << extent_str(b)
                            << "); expected out and lse apart from every input, the workspace "
                               "and each other");
}

}  // namespace

bool tensors_overlap(const TensorView& a, const TensorView& b, std::string& extents) {
  if (a.device != b.device) return false;
  const ByteExtent ea = byte_extent(a), eb = byte_extent(b);
  if (ea.empty() || eb.empty() || ea.end <= eb.begin || eb.end <= ea.begin) return false;
  extents = "bytes " + extent_str(ea) + " and " + extent_str(eb);
  return true;
}

void check_outputs_apart(const DecodeParams& prm) {
  const NamedTensor inputs[] = {{"query", &prm.query},
                                {"kv_cache", &prm.kv_cache},
                                {"block_tables", &prm.block_tables},
                                {"seq_lens", &prm.seq_lens},
                                {"cum_seq_lens_q", &prm.cum_seq_lens_q},
                                {"sinks", &prm.sinks},
                                {"mask", &prm.mask},
                                {"sparse_indices", &prm.sparse_indices},
                                {"sparse_topk_lens", &prm.sparse_topk_lens},
                                {"bmm1_scale (tensor)", &prm.bmm1_scale_tensor},
                                {"bmm2_scale (tensor)", &prm.bmm2_scale_tensor},
                                {"workspace", &prm.workspace}};
  const NamedTensor out{"out", &prm.out}, lse{"lse", &prm.lse};
  for (const NamedTensor& input : inputs) check_apart(out, input);
  for (const NamedTensor& input : inputs) check_apart(lse, input);
  check_apart(lse, out);
}

}  // namespace mla::detail
