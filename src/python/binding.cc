// The tvm-ffi module of the Python package: workspace_size, plan, run and decode exported through
// tvm-ffi's C ABI (loaded by python/mla_decode/_lib.py with tvm_ffi.load_module). Links the library
// and libtvm_ffi, never Python or a framework: tensors arrive as DLPack tensors, which tvm-ffi
// converts from PyTorch, NumPy, CuPy or JAX.
//
// merge_states (the merge of context-parallel partial states) and peer_exchange (the transport of
// the p2p method) have their own arguments (merge_states_op, peer_exchange_op). The four decode
// entry points take the same positional arguments (entry() below; the Python side builds them in
// python/mla_decode/_api.py, _Call.ffi_args). mla::Error leaves as a Python TypeError (code
// TypeError) or ValueError (every other code) carrying the same message.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/string.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "mla/mla.h"

namespace mla::python {
namespace {

namespace ffi = tvm::ffi;
using OptTensor = ffi::Optional<ffi::TensorView>;

static_assert(std::is_trivially_copyable_v<Plan>, "a Plan crosses to Python as its bytes");

// The data pointer of tensors described by shape only (never dereferenced): it marks them present.
char no_memory;

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, message);
}

int32_t to_int32(int64_t value, const char* name) {
  if (value < INT32_MIN || value > INT32_MAX) {
    fail(std::string(name) + ": expected a value that fits int32, got " + std::to_string(value));
  }
  return static_cast<int32_t>(value);
}

// A DLPack tensor as an mla::TensorView (undefined when not given). `dtype_code` >= 0 gives the
// real type of a same-width unsigned view: Python passes float8_e4m3fn (and NumPy's ml_dtypes
// bfloat16) that way, since not every framework exports them through DLPack.
TensorView to_view(const OptTensor& given, const char* name, int64_t dtype_code = -1) {
  TensorView view;
  if (!given.has_value()) return view;
  const ffi::TensorView& t = given.value();
  if (t.ndim() > TensorView::kMaxDims) {
    fail(std::string(name) + ": expected rank at most " + std::to_string(TensorView::kMaxDims) +
         ", got rank " + std::to_string(t.ndim()));
  }
  char* data = static_cast<char*>(t.data_ptr());
  view.data = data == nullptr ? nullptr : data + t.byte_offset();
  const DLDataType dt = t.dtype();
  view.dtype = {dt.code, dt.bits, dt.lanes};
  if (dtype_code >= 0) {
    if (dt.code != kDLUInt) {
      fail(std::string(name) + ": internal error: a dtype override needs an unsigned view");
    }
    view.dtype.code = static_cast<uint8_t>(dtype_code);
  }
  view.device = {static_cast<int32_t>(t.device().device_type), t.device().device_id};
  view.ndim = t.ndim();
  // A tensor without elements has no meaningful strides (NumPy exports zeros): describe it as
  // compact. Otherwise the producer's strides; tvm-ffi fills them for every tensor it converts.
  const bool empty = t.numel() == 0;
  int64_t compact = 1;
  for (int d = t.ndim() - 1; d >= 0; --d) {
    view.shape[d] = t.shape()[d];
    view.strides[d] = empty ? compact : t.strides()[d];
    compact *= t.shape()[d];
  }
  return view;
}

// workspace_size() and plan() read only the shape and dtype of `out`. When the caller plans once
// for many layers it has no out tensor yet: describe the default one (docs/contract.md section 3)
// without memory.
TensorView shape_only_out(const TensorView& query, int32_t kv_lora_rank) {
  TensorView out;
  if (!query.defined() || query.ndim < 1 || query.ndim > TensorView::kMaxDims) return out;
  const bool q16 = query.dtype == dtype::kBFloat16 || query.dtype == dtype::kFloat16;
  out.data = &no_memory;
  out.dtype = q16 ? query.dtype : dtype::kBFloat16;
  out.device = query.device;
  out.ndim = query.ndim;
  int64_t stride = 1;
  for (int d = query.ndim - 1; d >= 0; --d) {
    out.shape[d] = d == query.ndim - 1 ? kv_lora_rank : query.shape[d];
    out.strides[d] = stride;
    stride *= out.shape[d];
  }
  return out;
}

// The stream a GPU backend launches on: the explicit one, else the caller's current stream as
// tvm-ffi's environment records it (PyTorch's current stream while a call with torch tensors runs).
void* launch_stream(Device device, const ffi::Optional<int64_t>& stream) {
  if (device.device_type != static_cast<int32_t>(DeviceType::kCUDA)) return nullptr;
  if (stream.has_value()) return reinterpret_cast<void*>(static_cast<intptr_t>(stream.value()));
  return TVMFFIEnvGetStream(device.device_type, device.device_id);
}

Plan plan_from_bytes(const ffi::Optional<ffi::Bytes>& given) {
  const std::string bytes = given.has_value() ? std::string(given.value()) : std::string();
  if (bytes.size() != sizeof(Plan)) {
    fail("plan: expected a Plan made by mla_decode.plan() (" + std::to_string(sizeof(Plan)) +
         " bytes), got " + std::to_string(bytes.size()) + " bytes");
  }
  Plan plan;
  std::memcpy(static_cast<void*>(&plan), bytes.data(), sizeof(Plan));
  return plan;
}

int64_t workspace_size_op(DecodeParams params, const ffi::Optional<ffi::Bytes>&) {
  if (!params.out.defined()) params.out = shape_only_out(params.query, params.kv_lora_rank);
  return static_cast<int64_t>(workspace_size(params));
}

ffi::Bytes plan_op(DecodeParams params, const ffi::Optional<ffi::Bytes>&) {
  if (!params.out.defined()) params.out = shape_only_out(params.query, params.kv_lora_rank);
  const Plan plan = mla::plan(params);
  return ffi::Bytes(reinterpret_cast<const char*>(&plan), sizeof(Plan));
}

void run_op(DecodeParams params, const ffi::Optional<ffi::Bytes>& plan) {
  mla::run(plan_from_bytes(plan), params);
}

void decode_op(DecodeParams params, const ffi::Optional<ffi::Bytes>&) { mla::decode(params); }

// One entry point per operation, all with these positional arguments, in this order. Tensors are
// optional (None) except where DecodeParams requires them; validation names what is missing.
// *_dtype_code: see to_view. stream: a cudaStream_t as an integer, or None for the environment's
// current stream.
template <auto Op>
auto entry(OptTensor query, OptTensor kv_cache, OptTensor block_tables, OptTensor seq_lens,
           OptTensor cum_seq_lens_q, OptTensor sinks, OptTensor mask, OptTensor sparse_indices,
           OptTensor sparse_topk_lens, OptTensor bmm1_scale_tensor, OptTensor bmm2_scale_tensor,
           OptTensor out, OptTensor lse, OptTensor workspace, int64_t kv_lora_rank,
           int64_t qk_rope_head_dim, int64_t qk_nope_head_dim, int64_t max_seq_len,
           int64_t max_q_len, int64_t sparse_top_k, double bmm1_scale, double bmm2_scale,
           double skip_softmax_threshold_scale_factor, ffi::String backend, bool enable_pdl,
           bool validate_indices, ffi::Optional<int64_t> stream, int64_t query_dtype_code,
           int64_t kv_cache_dtype_code, int64_t out_dtype_code, ffi::Optional<ffi::Bytes> plan) {
  try {
    DecodeParams p;
    p.query = to_view(query, "query", query_dtype_code);
    p.kv_cache = to_view(kv_cache, "kv_cache", kv_cache_dtype_code);
    p.block_tables = to_view(block_tables, "block_tables");
    p.seq_lens = to_view(seq_lens, "seq_lens");
    p.cum_seq_lens_q = to_view(cum_seq_lens_q, "cum_seq_lens_q");
    p.sinks = to_view(sinks, "sinks");
    p.mask = to_view(mask, "mask");
    p.sparse_indices = to_view(sparse_indices, "sparse_indices");
    p.sparse_topk_lens = to_view(sparse_topk_lens, "sparse_topk_lens");
    p.bmm1_scale_tensor = to_view(bmm1_scale_tensor, "bmm1_scale");
    p.bmm2_scale_tensor = to_view(bmm2_scale_tensor, "bmm2_scale");
    p.out = to_view(out, "out", out_dtype_code);
    p.lse = to_view(lse, "lse");
    p.workspace = to_view(workspace, "workspace");
    p.kv_lora_rank = to_int32(kv_lora_rank, "kv_lora_rank");
    p.qk_rope_head_dim = to_int32(qk_rope_head_dim, "qk_rope_head_dim");
    p.qk_nope_head_dim = to_int32(qk_nope_head_dim, "qk_nope_head_dim");
    p.max_seq_len = to_int32(max_seq_len, "max_seq_len");
    p.max_q_len = to_int32(max_q_len, "max_q_len");
    p.sparse_top_k = to_int32(sparse_top_k, "sparse_top_k");
    p.bmm1_scale = static_cast<float>(bmm1_scale);
    p.bmm2_scale = static_cast<float>(bmm2_scale);
    p.skip_softmax_threshold_scale_factor = static_cast<float>(skip_softmax_threshold_scale_factor);
    p.backend = parse_backend(std::string(backend));
    p.enable_pdl = enable_pdl;
    p.validate_indices = validate_indices;
    p.stream = launch_stream(p.query.device, stream);
    return Op(std::move(p), plan);
  } catch (const Error& e) {
    const char* kind = e.code() == ErrorCode::kTypeError ? "TypeError" : "ValueError";
    throw ffi::Error(kind, e.what(), TVMFFIBacktrace(__FILE__, __LINE__, TVM_FFI_FUNC_SIG, 0));
  }
}

// merge_states (include/mla/merge.h): out_parts [N, T, H, L], lse_parts [N, T, H], optional sinks
// [H], out [T, H, L], optional lse [T, H]. *_dtype_code: see to_view (NumPy's bfloat16).
void merge_states_op(OptTensor out_parts, OptTensor lse_parts, OptTensor sinks, OptTensor out,
                     OptTensor lse, ffi::String backend, bool enable_pdl,
                     ffi::Optional<int64_t> stream, int64_t out_parts_dtype_code,
                     int64_t out_dtype_code) {
  try {
    MergeParams p;
    p.out_parts = to_view(out_parts, "out_parts", out_parts_dtype_code);
    p.lse_parts = to_view(lse_parts, "lse_parts");
    p.sinks = to_view(sinks, "sinks");
    p.out = to_view(out, "out", out_dtype_code);
    p.lse = to_view(lse, "lse");
    p.backend = parse_backend(std::string(backend));
    p.enable_pdl = enable_pdl;
    p.stream = launch_stream(p.out_parts.device, stream);
    merge_states(p);
  } catch (const Error& e) {
    const char* kind = e.code() == ErrorCode::kTypeError ? "TypeError" : "ValueError";
    throw ffi::Error(kind, e.what(), TVMFFIBacktrace(__FILE__, __LINE__, TVM_FFI_FUNC_SIG, 0));
  }
}

// peer_exchange (include/mla/exchange.h): buffer uint8 [bytes] (this rank's), peer_buffers int64
// [N] on the host (every rank's buffer address as mapped in this process).
void peer_exchange_op(OptTensor buffer, OptTensor peer_buffers, int64_t rank, int64_t slot_bytes,
                      ffi::String backend, bool enable_pdl, ffi::Optional<int64_t> stream) {
  try {
    PeerExchangeParams p;
    p.buffer = to_view(buffer, "buffer");
    if (!peer_buffers.has_value()) fail("peer_buffers: expected a tensor, got none");
    const ffi::TensorView& peers = peer_buffers.value();
    const DLDataType type = peers.dtype();
    const int32_t where = peers.device().device_type;
    if (peers.ndim() != 1 || type.code != kDLInt || type.bits != 64 || type.lanes != 1 ||
        (where != kDLCPU && where != kDLCUDAHost)) {
      fail("peer_buffers: expected a 1-D int64 host tensor of N addresses");
    }
    const int64_t n = peers.shape()[0];
    if (n < 1 || n > kMaxPeerRanks) {
      fail("num_ranks: expected 1 to " + std::to_string(kMaxPeerRanks) + " peer_buffers, got " +
           std::to_string(n));
    }
    p.num_ranks = static_cast<int>(n);
    const char* base = static_cast<const char*>(peers.data_ptr()) + peers.byte_offset();
    for (int r = 0; r < p.num_ranks; ++r) {
      int64_t address = 0;
      std::memcpy(&address, base + r * peers.strides()[0] * 8, 8);
      p.peer_buffers[r] = reinterpret_cast<void*>(static_cast<intptr_t>(address));
    }
    p.rank = to_int32(rank, "rank");
    p.slot_bytes = slot_bytes;
    p.backend = parse_backend(std::string(backend));
    p.enable_pdl = enable_pdl;
    p.stream = launch_stream(p.buffer.device, stream);
    peer_exchange(p);
  } catch (const Error& e) {
    const char* kind = e.code() == ErrorCode::kTypeError ? "TypeError" : "ValueError";
    throw ffi::Error(kind, e.what(), TVMFFIBacktrace(__FILE__, __LINE__, TVM_FFI_FUNC_SIG, 0));
  }
}

// peer_exchange_buffer_bytes (include/mla/exchange.h).
int64_t peer_exchange_buffer_bytes_op(int64_t num_ranks, int64_t slot_bytes) {
  try {
    return peer_exchange_buffer_bytes(to_int32(num_ranks, "num_ranks"), slot_bytes);
  } catch (const Error& e) {
    throw ffi::Error("ValueError", e.what(),
                     TVMFFIBacktrace(__FILE__, __LINE__, TVM_FFI_FUNC_SIG, 0));
  }
}

// The stream a GPU backend would launch on for a call with this query and `stream` argument, as an
// integer (0 for host tensors): lets tests check that the caller's stream arrives.
int64_t launch_stream_of(ffi::TensorView query, ffi::Optional<int64_t> stream) {
  const DLDevice d = query.device();
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(
      launch_stream({static_cast<int32_t>(d.device_type), d.device_id}, stream)));
}

// Whether this build implements `backend` and accepts a DeepSeek-shaped call on its device
// (H 128, D 512 + 64, bf16, page 64): asks workspace_size() about a call described without memory.
bool backend_available(ffi::String name) {
  try {
    const Backend backend = parse_backend(std::string(name));
    const Device device = backend == Backend::kSm90 ? cuda_device(0) : kCPU;
    DecodeParams p;
    p.query = TensorView::contiguous(&no_memory, dtype::kBFloat16, {1, 1, 128, 576}, device);
    p.kv_cache = TensorView::contiguous(&no_memory, dtype::kBFloat16, {1, 64, 576}, device);
    p.block_tables = TensorView::contiguous(&no_memory, dtype::kInt32, {1, 1}, device);
    p.seq_lens = TensorView::contiguous(&no_memory, dtype::kInt32, {1}, device);
    p.out = TensorView::contiguous(&no_memory, dtype::kBFloat16, {1, 1, 128, 512}, device);
    p.backend = backend;
    workspace_size(p);
    return true;
  } catch (const std::exception&) {  // mla::Error: not implemented here, or no usable device
    return false;
  }
}

}  // namespace
}  // namespace mla::python

TVM_FFI_DLL_EXPORT_TYPED_FUNC(workspace_size, mla::python::entry<mla::python::workspace_size_op>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(plan, mla::python::entry<mla::python::plan_op>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, mla::python::entry<mla::python::run_op>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(decode, mla::python::entry<mla::python::decode_op>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_states, mla::python::merge_states_op);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(peer_exchange, mla::python::peer_exchange_op);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(peer_exchange_buffer_bytes,
                              mla::python::peer_exchange_buffer_bytes_op);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(backend_available, mla::python::backend_available);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(launch_stream, mla::python::launch_stream_of);
