// libFuzzer target over the C++ API's host validation (docs/contract.md section 5), built and run
// by scripts/fuzz_validate.sh against a cpu-only build of the library with AddressSanitizer and
// UndefinedBehaviorSanitizer.
//
// Each input describes one call: a consistent dense, ragged or sparse problem (sizes, dtypes,
// optional tensors, scalars) built from the first bytes, then up to eight mutations of single
// fields (rank, one size, one stride, dtype, device, data pointer) that break it. Every tensor gets
// its own heap buffer of exactly the bytes its shape and strides span, so AddressSanitizer reports
// any read or write the library makes past a tensor. The target calls mla::workspace_size and
// mla::plan, and mla::decode where every tensor still fits its buffer and the work is small. It
// catches mla::Error only: a crash, a sanitizer report, any other exception, a call that takes
// seconds, or a rejected call that wrote out or lse is a finding.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "mla/mla.h"

namespace {

using mla::DataType;
using mla::DecodeParams;
using mla::TensorView;
namespace dtype = mla::dtype;

constexpr size_t kMaxBufferBytes = size_t{1} << 20;      // a tensor's buffer, for decode
constexpr size_t kMaxWorkspaceBytes = size_t{64} << 20;  // a workspace allocated for decode
constexpr double kMaxWork = 4e6;                         // query elements x keys, for decode

// The tensor arguments, in a fixed order.
TensorView DecodeParams::*const kTensors[] = {&DecodeParams::query,
                                              &DecodeParams::kv_cache,
                                              &DecodeParams::block_tables,
                                              &DecodeParams::seq_lens,
                                              &DecodeParams::cum_seq_lens_q,
                                              &DecodeParams::sinks,
                                              &DecodeParams::mask,
                                              &DecodeParams::sparse_indices,
                                              &DecodeParams::sparse_topk_lens,
                                              &DecodeParams::bmm1_scale_tensor,
                                              &DecodeParams::bmm2_scale_tensor,
                                              &DecodeParams::out,
                                              &DecodeParams::lse,
                                              &DecodeParams::workspace};
constexpr int kNumTensors = sizeof(kTensors) / sizeof(kTensors[0]);
constexpr int kOut = 11, kLse = 12, kWorkspace = 13;

const DataType kDtypes[] = {dtype::kBFloat16,   dtype::kFloat16,   dtype::kFloat32,
                            dtype::kFloat8E4M3, dtype::kInt32,     dtype::kUInt32,
                            dtype::kUInt16,     dtype::kUInt8,     DataType{0, 64, 1},
                            DataType{2, 16, 2}, DataType{4, 16, 1}};

int64_t element_bytes(DataType t) { return (int64_t{t.bits} * t.lanes + 7) / 8; }

// Bytes from data to the end of the last element; -1 when a size or stride is negative or the
// extent does not fit (the call may then not run: its memory is not the buffer's).
int64_t extent_bytes(const TensorView& t) {
  if (!t.defined()) return 0;
  if (t.ndim > TensorView::kMaxDims) return -1;
  double last = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0 || t.strides[d] < 0) return -1;
    if (t.shape[d] == 0) return 0;
    last += static_cast<double>(t.shape[d] - 1) * static_cast<double>(t.strides[d]);
  }
  const double bytes = (last + 1) * static_cast<double>(element_bytes(t.dtype));
  return bytes > static_cast<double>(kMaxBufferBytes) ? -1 : static_cast<int64_t>(bytes);
}

// One call: the parameters and the buffers behind its tensors.
struct Call {
  DecodeParams p;
  std::vector<std::vector<uint8_t>> buffers = std::vector<std::vector<uint8_t>>(kNumTensors);
  std::vector<size_t> offsets = std::vector<size_t>(kNumTensors, 0);

  // A row-major view of `shape` on a buffer of exactly its bytes, filled from the input.
  void make(int index, DataType type, std::initializer_list<int64_t> shape,
            FuzzedDataProvider& in) {
    TensorView t = TensorView::contiguous(nullptr, type, shape);
    const int64_t bytes = extent_bytes(t);
    std::vector<uint8_t>& buffer = buffers[index];
    buffer.assign(bytes > 0 ? static_cast<size_t>(bytes) : 0, 0);
    const std::vector<uint8_t> fill = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange(0, 64));
    for (size_t i = 0; i < buffer.size() && !fill.empty(); ++i) buffer[i] = fill[i % fill.size()];
    t.data = buffer.empty() ? nullptr : buffer.data();
    p.*kTensors[index] = t;
  }

  // Copies `bytes` bytes into tensor `index`'s buffer at `offset` (nothing for an empty copy).
  void put(int index, size_t offset, const void* source, size_t bytes) {
    if (bytes > 0) std::memcpy(buffers[index].data() + offset, source, bytes);
  }

  // Whether every tensor lies inside its buffer (so decode touches only them).
  bool fits() const {
    for (int i = 0; i < kNumTensors; ++i) {
      const TensorView& t = p.*kTensors[i];
      if (!t.defined()) continue;
      const int64_t bytes = extent_bytes(t);
      if (bytes < 0) return false;
      if (bytes == 0) continue;
      const std::vector<uint8_t>& buffer = buffers[i];
      if (buffer.empty() || t.data != buffer.data() + offsets[i]) return false;
      if (offsets[i] + static_cast<size_t>(bytes) > buffer.size()) return false;
    }
    return true;
  }
};

int64_t pick_size(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 11)) {
    case 0:
      return -1;
    case 1:
      return std::numeric_limits<int64_t>::min();
    case 2:
      return std::numeric_limits<int64_t>::max();
    case 3:
      return int64_t{1} << 31;
    case 4:
      return (int64_t{1} << 31) - 1;
    case 5:
      return int64_t{1} << 62;
    case 6:
      return in.ConsumeIntegral<int64_t>();
    case 7:
      return in.ConsumeIntegralInRange<int64_t>(0, 1 << 20);
    default:
      return in.ConsumeIntegralInRange<int64_t>(0, 9);
  }
}

void mutate(Call& c, FuzzedDataProvider& in) {
  const int index = in.ConsumeIntegralInRange(0, kNumTensors - 1);
  TensorView& t = c.p.*kTensors[index];
  const int dim = in.ConsumeIntegralInRange(0, TensorView::kMaxDims - 1);
  switch (in.ConsumeIntegralInRange(0, 11)) {
    case 0:
      t.ndim = in.ConsumeIntegralInRange(-2, TensorView::kMaxDims + 2);
      break;
    case 1:
    case 2:
      t.shape[dim] = pick_size(in);
      break;
    case 3:
    case 4:
      t.strides[dim] = pick_size(in);
      break;
    case 5:
      t.dtype = in.ConsumeBool()
                    ? kDtypes[in.ConsumeIntegralInRange<size_t>(
                          0, sizeof(kDtypes) / sizeof(kDtypes[0]) - 1)]
                    : DataType{in.ConsumeIntegral<uint8_t>(), in.ConsumeIntegral<uint8_t>(),
                               in.ConsumeIntegral<uint16_t>()};
      break;
    case 6:
      switch (in.ConsumeIntegralInRange(0, 3)) {
        case 0:
          t.device = mla::kCPU;
          break;
        case 1:
          t.device = {static_cast<int32_t>(mla::DeviceType::kCUDAHost), 0};
          break;
        case 2:
          t.device = mla::cuda_device(in.ConsumeIntegralInRange(0, 1));
          break;
        default:
          t.device = {in.ConsumeIntegral<int32_t>(), in.ConsumeIntegral<int32_t>()};
      }
      break;
    case 7:
      t.data = nullptr;
      break;
    case 8: {
      // Another tensor's memory, or its own shifted: overlaps and misplaced views.
      const int other = in.ConsumeIntegralInRange(0, kNumTensors - 1);
      std::vector<uint8_t>& buffer = c.buffers[other];
      if (!buffer.empty()) {
        const size_t offset = in.ConsumeIntegralInRange<size_t>(0, buffer.size() - 1);
        t.data = buffer.data() + offset;
        if (other == index) c.offsets[index] = offset;
      }
      break;
    }
    case 9:
      t = TensorView{};  // drop the argument
      break;
    default: {
      // A scalar instead of a tensor field.
      const int32_t v = in.ConsumeBool() ? in.ConsumeIntegral<int32_t>()
                                         : in.ConsumeIntegralInRange<int32_t>(-2, 70);
      switch (in.ConsumeIntegralInRange(0, 5)) {
        case 0:
          c.p.kv_lora_rank = v;
          break;
        case 1:
          c.p.qk_rope_head_dim = v;
          break;
        case 2:
          c.p.qk_nope_head_dim = v;
          break;
        case 3:
          c.p.max_seq_len = v;
          break;
        case 4:
          c.p.max_q_len = v;
          break;
        default:
          c.p.sparse_top_k = v;
      }
    }
  }
}

// A consistent call from the first bytes of the input.
Call make_call(FuzzedDataProvider& in) {
  Call c;
  DecodeParams& p = c.p;
  const bool sparse = in.ConsumeIntegralInRange(0, 3) == 0;
  const bool ragged = in.ConsumeBool();
  const bool ds_mla = in.ConsumeIntegralInRange(0, 7) == 0;
  const int64_t batch = in.ConsumeIntegralInRange(0, 4);
  const int64_t q_len = in.ConsumeIntegralInRange(0, 4);
  const int64_t heads = in.ConsumeIntegralInRange(1, 8);
  const int64_t L = ds_mla ? 512 : in.ConsumeIntegralInRange(1, 48);
  const int64_t R = ds_mla ? 64 : in.ConsumeIntegralInRange(0, 24);
  const int64_t D = L + R;
  const int64_t page_size = int64_t{1} << in.ConsumeIntegralInRange(0, 5);
  const int64_t pages = in.ConsumeIntegralInRange(0, 12);
  const int64_t max_pages = in.ConsumeIntegralInRange(0, 5);
  const int64_t top_k = in.ConsumeIntegralInRange(1, 16);
  const bool kv_4d = in.ConsumeBool();

  // (query, kv_cache) dtypes: an accepted pair, or any two.
  static const DataType kPairs[][2] = {{dtype::kBFloat16, dtype::kBFloat16},
                                       {dtype::kFloat16, dtype::kFloat16},
                                       {dtype::kFloat8E4M3, dtype::kFloat8E4M3},
                                       {dtype::kBFloat16, dtype::kFloat8E4M3},
                                       {dtype::kFloat32, dtype::kFloat32}};
  DataType q_type, kv_type;
  if (ds_mla) {
    q_type = dtype::kBFloat16;
    kv_type = dtype::kUInt8;
  } else {
    const size_t pair = in.ConsumeIntegralInRange<size_t>(0, 4);
    q_type = kPairs[pair][0];
    kv_type = kPairs[pair][1];
  }

  // Query tokens: dense B * q_len, or ragged lengths that sum to T.
  std::vector<int32_t> cum(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b) cum[b + 1] = cum[b] + in.ConsumeIntegralInRange(0, 3);
  const int64_t tokens = ragged ? cum[batch] : batch * q_len;

  if (ragged) {
    c.make(0, q_type, {tokens, heads, D}, in);
    c.make(4, dtype::kInt32, {batch + 1}, in);
    c.put(4, 0, cum.data(), cum.size() * sizeof(int32_t));
  } else {
    c.make(0, q_type, {batch, q_len, heads, D}, in);
  }
  const int64_t row = ds_mla ? 656 : D;
  if (kv_4d) {
    c.make(1, kv_type, {pages, 1, page_size, row}, in);
  } else {
    c.make(1, kv_type, {pages, page_size, row}, in);
  }
  c.make(3, dtype::kInt32, {batch}, in);
  // seq_lens: mostly within the block tables' capacity, at least the query tokens.
  const int64_t capacity = sparse ? 64 : max_pages * page_size;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = ragged ? cum[b + 1] - cum[b] : q_len;
    int32_t len = static_cast<int32_t>(in.ConsumeIntegralInRange<int64_t>(0, capacity + 1));
    if (in.ConsumeBool() && len < n) len = static_cast<int32_t>(n);
    c.put(3, 4 * b, &len, 4);
  }
  if (sparse) {
    p.sparse_top_k = static_cast<int32_t>(top_k);
    if (ragged) {
      c.make(7, dtype::kInt32, {tokens, top_k}, in);
    } else {
      c.make(7, dtype::kInt32, {batch, q_len, top_k}, in);
    }
    // Entries: -1 or a slot of the pool, mostly.
    for (size_t i = 0; i + 4 <= c.buffers[7].size(); i += 4) {
      const int32_t slot = in.ConsumeIntegralInRange<int32_t>(
          -1, static_cast<int32_t>(pages * page_size + (in.ConsumeBool() ? 1 : 0)));
      c.put(7, i, &slot, 4);
    }
    switch (in.ConsumeIntegralInRange(0, 2)) {
      case 1:
        c.make(8, dtype::kInt32, {batch}, in);
        break;
      case 2:
        if (ragged) {
          c.make(8, dtype::kInt32, {tokens}, in);
        } else {
          c.make(8, dtype::kInt32, {batch, q_len}, in);
        }
        break;
      default:
        break;
    }
  } else {
    const bool kv_tables = in.ConsumeIntegralInRange(0, 3) == 0;
    if (kv_tables) {
      c.make(2, dtype::kInt32, {batch, 2, max_pages}, in);
    } else {
      c.make(2, dtype::kInt32, {batch, max_pages}, in);
    }
    // Pages: mostly within the pool, row 1 mostly a copy of row 0.
    std::vector<int32_t> table(static_cast<size_t>(batch * max_pages));
    for (int32_t& page : table) {
      page = in.ConsumeIntegralInRange<int32_t>(in.ConsumeBool() ? -1 : 0,
                                                static_cast<int32_t>(pages > 0 ? pages - 1 : 0));
    }
    for (int64_t b = 0; b < batch; ++b) {
      for (int copy = 0; copy < (kv_tables ? 2 : 1); ++copy) {
        c.put(2, 4 * ((b * (kv_tables ? 2 : 1) + copy) * max_pages), table.data() + b * max_pages,
              4 * max_pages);
      }
    }
    if (in.ConsumeIntegralInRange(0, 3) == 0) {
      const bool u16 = in.ConsumeBool();
      const int64_t words = in.ConsumeIntegralInRange(0, 2) * (u16 ? 2 : 1);
      const DataType m = u16 ? dtype::kUInt16 : dtype::kUInt32;
      if (ragged) {
        c.make(6, m, {tokens, words}, in);
      } else {
        c.make(6, m, {batch, q_len, words}, in);
      }
    }
  }
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    static const DataType kSinks[] = {dtype::kFloat32, dtype::kBFloat16, dtype::kFloat16};
    c.make(5, kSinks[in.ConsumeIntegralInRange(0, 2)], {heads}, in);
  }
  if (in.ConsumeIntegralInRange(0, 3) == 0) c.make(9, dtype::kFloat32, {1}, in);
  if (in.ConsumeIntegralInRange(0, 3) == 0) c.make(10, dtype::kFloat32, {1}, in);
  const DataType out_type = in.ConsumeBool() ? dtype::kBFloat16 : dtype::kFloat16;
  if (ragged) {
    c.make(kOut, out_type, {tokens, heads, L}, in);
    if (in.ConsumeBool()) c.make(kLse, dtype::kFloat32, {tokens, heads}, in);
  } else {
    c.make(kOut, out_type, {batch, q_len, heads, L}, in);
    if (in.ConsumeBool()) c.make(kLse, dtype::kFloat32, {batch, q_len, heads}, in);
  }

  p.kv_lora_rank = static_cast<int32_t>(L);
  p.qk_rope_head_dim = static_cast<int32_t>(R);
  p.qk_nope_head_dim = 128;
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      p.max_seq_len = in.ConsumeIntegral<int32_t>();
      break;
    case 1:
      p.max_seq_len = static_cast<int32_t>(in.ConsumeIntegralInRange<int64_t>(0, capacity));
      break;
    default:
      break;  // -1
  }
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      p.max_q_len = in.ConsumeIntegral<int32_t>();
      break;
    case 1:
      p.max_q_len = in.ConsumeIntegralInRange(0, 4);
      break;
    default:
      break;
  }
  static const float kScalars[] = {1.0f,
                                   0.125f,
                                   0.0f,
                                   -2.0f,
                                   1e-30f,
                                   std::numeric_limits<float>::infinity(),
                                   std::numeric_limits<float>::quiet_NaN(),
                                   std::numeric_limits<float>::denorm_min(),
                                   3e38f};
  p.bmm1_scale = kScalars[in.ConsumeIntegralInRange(0, 8)];
  p.bmm2_scale = kScalars[in.ConsumeIntegralInRange(0, 8)];
  p.skip_softmax_threshold_scale_factor =
      in.ConsumeIntegralInRange(0, 3) == 0 ? kScalars[in.ConsumeIntegralInRange(0, 8)] : 0.0f;
  switch (in.ConsumeIntegralInRange(0, 9)) {
    case 0:
      p.backend = mla::Backend::kAuto;
      break;
    case 1:
      p.backend = mla::Backend::kSm90;
      break;
    case 2:
      p.backend = static_cast<mla::Backend>(in.ConsumeIntegral<int>());
      break;
    default:
      p.backend = mla::Backend::kCpu;
  }
  p.validate_indices = in.ConsumeBool();
  return c;
}

// Query elements times the keys each row reads: the cpu backend's work, roughly.
double work(const DecodeParams& p) {
  double n = 1;
  for (int d = 0; d < p.query.ndim && d < TensorView::kMaxDims; ++d) n *= p.query.shape[d];
  double keys = p.sparse_top_k;
  if (p.block_tables.defined() && p.block_tables.ndim >= 1 &&
      p.block_tables.ndim <= TensorView::kMaxDims && p.kv_cache.ndim >= 2 &&
      p.kv_cache.ndim <= TensorView::kMaxDims) {
    keys += static_cast<double>(p.block_tables.shape[p.block_tables.ndim - 1]) *
            static_cast<double>(p.kv_cache.shape[p.kv_cache.ndim - 2]);
  }
  return n * (keys + 1);
}

[[noreturn]] void finding(const char* what, const mla::Error* e) {
  std::fprintf(stderr, "validate_fuzz: %s%s%s\n", what, e ? ": " : "", e ? e->what() : "");
  std::abort();
}

void check_message(const mla::Error& e) {
  if (e.what() == nullptr || e.what()[0] == '\0') finding("an mla::Error without a message", &e);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Call c = make_call(in);
  const int mutations = in.ConsumeIntegralInRange(0, 8);
  for (int i = 0; i < mutations; ++i) mutate(c, in);

  size_t required = 0;
  bool sized = false;
  try {
    required = mla::workspace_size(c.p);
    sized = true;
  } catch (const mla::Error& e) {
    check_message(e);
  }
  // The workspace: unless a mutation chose one, exactly the bytes required, one byte fewer, or
  // none.
  if (!c.p.workspace.defined() && sized && required <= kMaxWorkspaceBytes) {
    const int mode = in.ConsumeIntegralInRange(0, 5);
    if (mode != 0) {
      const size_t bytes = mode == 1 && required > 0 ? required - 1 : required;
      c.buffers[kWorkspace].assign(bytes, 0);
      c.p.workspace = TensorView::contiguous(c.buffers[kWorkspace].data(), dtype::kUInt8,
                                             {static_cast<int64_t>(bytes)});
    }
  }

  try {
    mla::plan(c.p);
  } catch (const mla::Error& e) {
    check_message(e);
  }

  if (!c.fits() || work(c.p) > kMaxWork) return 0;
  // The outputs as given, to check that a rejected call leaves them alone.
  const std::vector<uint8_t> out_before = c.buffers[kOut], lse_before = c.buffers[kLse];
  try {
    mla::decode(c.p);
  } catch (const mla::Error& e) {
    check_message(e);
    // The cpu backend checks index contents as it runs; every other rejection comes before.
    const bool before_run =
        e.code() != mla::ErrorCode::kBadIndex && e.code() != mla::ErrorCode::kRuntimeError;
    if (before_run && (c.buffers[kOut] != out_before || c.buffers[kLse] != lse_before)) {
      finding("a rejected call wrote out or lse", &e);
    }
  }
  return 0;
}
