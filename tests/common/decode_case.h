// One decode call of the sweeps, built with test hygiene: fresh random inputs, NaN-poisoned out and
// lse, KV rows past seq_len and unused pages NaN, invalid page ids in unused block_tables slots,
// pages handed out in a random permutation, garbage in the workspace. Shared by the backends'
// decode tests; the float64 oracle sees the same numbers, decoded.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "mla/mla.h"
#include "oracle/oracle.h"

namespace mla_test::decode_case {

using mla::DataType;
using mla::TensorView;
using mla_test::Buffer;
namespace dt = mla::dtype;

enum class Mask { kNone, kU32, kU16 };

// One decode call, described by what matters to the sweep; build() turns it into tensors.
struct Case {
  int B = 2;
  int H = 16;
  int L = 32;  // kv_lora_rank; small unless the point is the DeepSeek shape
  int R = 16;  // qk_rope_head_dim
  int q_len = 1;
  std::vector<int> ragged_q_lens;  // non-empty: ragged query [T, H, D] with cum_seq_lens_q
  bool max_q_len_hint = false;     // ragged: pass max_q_len
  std::vector<int> seq_lens;       // [B]; sparse mode: ignored by the math
  int page_size = 16;
  DataType q_dtype = dt::kBFloat16;
  DataType kv_dtype = dt::kBFloat16;
  DataType out_dtype = dt::kBFloat16;
  bool lse = true;
  bool sinks = false;
  double sink_lo = -2.0, sink_hi = 3.0;
  Mask mask = Mask::kNone;
  int top_k = 0;  // > 0: sparse mode
  oracle::TopkLens topk_lens = oracle::TopkLens::kNone;
  bool scale_tensors = false;  // bmm1/bmm2 as 1-element fp32 tensors (host floats set to garbage)
  double bmm1 = 0.0;           // 0: 4 / sqrt(D), scores of spread ~1.3
  double bmm2 = 1.0;
  float skip = 0.0f;      // skip_softmax_threshold_scale_factor
  bool strided = false;   // padded strides on query, kv, block_tables, out
  bool out_odd = false;   // out's strides not multiples of 8 elements (no 16-byte vector stores)
  bool out_quad = false;  // out's strides multiples of 4 elements, not of 8 (8-byte stores only)
  bool kv4d = false;      // kv_cache as [P, 1, page_size, D]
  uint64_t seed = 1;
};

inline std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + std::to_string(v[i]);
  return s;
}

inline std::string case_name(const Case& c) {
  std::ostringstream s;
  s << "B" << c.B << "_H" << c.H;
  if (c.L != 32 || c.R != 16) s << "_L" << c.L << "R" << c.R;
  if (c.ragged_q_lens.empty()) {
    s << "_q" << c.q_len;
  } else {
    s << "_ragged" << join(c.ragged_q_lens) << (c.max_q_len_hint ? "hint" : "");
  }
  if (c.seq_lens.size() <= 8) {
    s << "_seq" << join(c.seq_lens);
  } else {  // long batches: the first few and the count
    s << "_seq" << join(std::vector<int>(c.seq_lens.begin(), c.seq_lens.begin() + 4)) << "x_of"
      << c.seq_lens.size();
  }
  s << "_ps" << c.page_size << "_" << mla_test::dtype_name(c.q_dtype) << "x"
    << mla_test::dtype_name(c.kv_dtype) << "_out" << mla_test::dtype_name(c.out_dtype);
  if (!c.lse) s << "_nolse";
  if (c.sinks) s << "_sinks";
  if (c.mask == Mask::kU32) s << "_mask32";
  if (c.mask == Mask::kU16) s << "_mask16";
  if (c.top_k > 0) {
    s << "_topk" << c.top_k;
    if (c.topk_lens == oracle::TopkLens::kPerRequest) s << "_lensreq";
    if (c.topk_lens == oracle::TopkLens::kPerToken) s << "_lenstok";
  }
  if (c.scale_tensors) s << "_scaletensor";
  if (c.bmm1 != 0.0 || c.bmm2 != 1.0) {  // in thousandths; bmm1 0 is the default 4 / sqrt(D)
    s << "_bmm" << static_cast<int>(std::lround(c.bmm1 * 1000)) << "m"
      << static_cast<int>(std::lround(c.bmm2 * 1000)) << "m";
  }
  if (c.skip > 0) s << "_skip";
  if (c.strided) s << "_strided";
  if (c.out_odd) s << "_outodd";
  if (c.out_quad) s << "_outquad";
  if (c.kv4d) s << "_kv4d";
  return s.str();
}

inline std::ostream& operator<<(std::ostream& os, const Case& c) { return os << case_name(c); }

// The space a suite draws random all-feature cases from (mixed_case below).
struct MixedSpace {
  std::vector<int> heads;
  std::vector<int> page_sizes;
  std::vector<DataType> q_dtypes;  // (q_dtypes[i], kv_dtypes[i]) are the dtype pairs
  std::vector<DataType> kv_dtypes;
  int max_seq_len;          // the longest of the three seq_len bands is 71..max_seq_len
  double bmm1_lo, bmm1_hi;  // bmm1_scale when not the default
};

// One random combination of every feature at once (heads, pages, dtypes, ragged, sparse or mask,
// sinks, scales, skip-softmax, strides, 4-D cache), fixed by `seed`, to catch interactions.
inline Case mixed_case(uint64_t seed, const MixedSpace& space) {
  Case c;
  c.seed = seed;
  mla_test::Rng rng(c.seed);
  const auto pick = [&](const auto& v) {
    return v[rng.randint(0, static_cast<int>(v.size()) - 1)];
  };
  c.B = rng.randint(1, 4);
  c.H = pick(space.heads);
  c.page_size = pick(space.page_sizes);
  const int pair = rng.randint(0, static_cast<int>(space.q_dtypes.size()) - 1);
  c.q_dtype = space.q_dtypes[pair];
  c.kv_dtype = space.kv_dtypes[pair];
  c.out_dtype = rng.coin(0.5) ? dt::kBFloat16 : dt::kFloat16;
  c.lse = rng.coin(0.7);
  c.sinks = rng.coin(0.4);
  c.q_len = rng.randint(1, 5);
  if (rng.coin(0.4)) {
    for (int r = 0; r < c.B; ++r) c.ragged_q_lens.push_back(rng.randint(0, 5));
    c.max_q_len_hint = rng.coin(0.5);
  }
  const bool sparse = rng.coin(0.25);
  for (int r = 0; r < c.B; ++r) {
    const int kind = rng.randint(0, 3);
    c.seq_lens.push_back(kind == 0   ? rng.randint(0, 3)
                         : kind == 1 ? rng.randint(4, 70)
                                     : rng.randint(71, space.max_seq_len));
    if (sparse) c.seq_lens.back() = std::max(c.seq_lens.back(), 1);
  }
  if (sparse) {
    c.top_k = std::vector<int>{8, 33, 64, 128}[rng.randint(0, 3)];
    const int lens = rng.randint(0, 2);
    c.topk_lens = lens == 0                              ? oracle::TopkLens::kNone
                  : lens == 1 && c.ragged_q_lens.empty() ? oracle::TopkLens::kPerRequest
                                                         : oracle::TopkLens::kPerToken;
  } else {
    const int mask = rng.randint(0, 3);
    c.mask = mask == 1 ? Mask::kU32 : mask == 2 ? Mask::kU16 : Mask::kNone;
  }
  c.scale_tensors = rng.coin(0.5);
  c.bmm1 = rng.coin(0.5) ? 0.0 : rng.uniform(space.bmm1_lo, space.bmm1_hi);
  c.bmm2 = rng.coin(0.5) ? 1.0 : rng.uniform(0.25, 4.0);
  c.skip = rng.coin(0.25) ? 1e-30f : 0.0f;
  c.strided = rng.coin(0.4);
  c.kv4d = rng.coin(0.3);
  return c;
}

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The tensors of one call, the oracle's view of the same numbers, and where each output lives.
// Not movable: params points into the buffers.
struct Built {
  Case c;
  int T = 0;  // query tokens
  int D = 0;  // L + R
  int num_pages = 0;
  std::vector<int> q_lens;  // [B] n_b

  // Storage behind params.
  Buffer query, kv, out, lse;
  std::vector<int32_t> block_tables, seq_lens, cum_seq_lens_q, sparse_indices, topk_lens;
  std::vector<uint32_t> mask;  // viewed as uint16 for Mask::kU16
  std::vector<float> sinks;
  float bmm1_value = 1.0f, bmm2_value = 1.0f;
  std::vector<uint8_t> workspace;

  // Layout.
  std::vector<int64_t> q_row;     // [T * H] element offset of query row (t, h)
  std::vector<int64_t> out_row;   // [T * H] element offset of out row (t, h)
  std::vector<bool> out_logical;  // [out.count()] false for padding
  int64_t kv_page_stride = 0, kv_row_stride = 0;
  int64_t max_pages = 0, block_table_stride = 0;

  mla::DecodeParams params;
  oracle::Input in;  // the same numbers, decoded

  Built() = default;
  Built(const Built&) = delete;
  Built& operator=(const Built&) = delete;

  // Fresh garbage in the workspace and NaN in out and lse.
  void reset_outputs(uint64_t seed) {
    out.poison();
    lse.poison();
    mla_test::Rng rng(seed);
    for (auto& byte : workspace) byte = static_cast<uint8_t>(rng.bits32());
  }
  // Overwrite one query element / one element of key j of request r, in the tensor and the oracle.
  void set_query(int t, int h, int d, double x) {
    in.query[(static_cast<size_t>(t) * c.H + h) * D + d] = query.set(q_row[t * c.H + h] + d, x);
  }
  void set_key(int r, int j, int d, double x) {
    const int64_t page = block_tables[r * block_table_stride + j / c.page_size];
    const int64_t slot = page * c.page_size + j % c.page_size;
    in.kv[slot * D + d] = kv.set(page * kv_page_stride + (j % c.page_size) * kv_row_stride + d, x);
  }

  bool outputs_untouched() const {
    for (int64_t i = 0; i < out.count(); ++i) {
      if (!out.is_poison(i)) return false;
    }
    for (int64_t i = 0; i < lse.count(); ++i) {
      if (!lse.is_poison(i)) return false;
    }
    return true;
  }
};

inline std::unique_ptr<Built> build(const Case& c) {
  auto bp = std::make_unique<Built>();
  Built& b = *bp;
  b.c = c;
  mla_test::Rng rng(c.seed * 7919 + 17);
  const bool ragged = !c.ragged_q_lens.empty();
  const bool sparse = c.top_k > 0;
  const int B = c.B, H = c.H, L = c.L, D = c.L + c.R;
  b.D = D;
  b.q_lens = ragged ? c.ragged_q_lens : std::vector<int>(B, c.q_len);
  b.T = std::accumulate(b.q_lens.begin(), b.q_lens.end(), 0);
  const int T = b.T;
  int max_n = 1;
  for (int n : b.q_lens) max_n = std::max(max_n, n);
  std::vector<int> first(B + 1, 0);
  for (int r = 0; r < B; ++r) first[r + 1] = first[r] + b.q_lens[r];
  auto token = [&](int r, int i) { return first[r] + i; };

  oracle::Input& in = b.in;
  in.batch = B;
  in.num_heads = H;
  in.kv_lora_rank = c.L;
  in.rope_dim = c.R;
  in.q_lens = b.q_lens;
  in.page_size = c.page_size;
  in.seq_lens = c.seq_lens;
  mla::DecodeParams& p = b.params;
  p.backend = mla::Backend::kCpu;
  p.kv_lora_rank = c.L;
  p.qk_rope_head_dim = c.R;
  p.qk_nope_head_dim = 128;

  // Query: [B, q_len, H, D] or [T, H, D], padding NaN.
  const int pad = c.strided ? 1 : 0;
  {
    const int64_t hs = D + 8 * pad, ts = H * hs + 24 * pad, bs = c.q_len * ts + 40 * pad;
    b.query = Buffer(c.q_dtype, ragged ? T * ts : B * bs);
    in.query.assign(static_cast<size_t>(T) * H * D, 0.0);
    b.q_row.assign(static_cast<size_t>(T) * H, 0);
    for (int r = 0; r < B; ++r) {
      for (int i = 0; i < b.q_lens[r]; ++i) {
        const int t = token(r, i);
        const int64_t base = ragged ? t * ts : r * bs + i * ts;
        for (int h = 0; h < H; ++h) {
          b.q_row[static_cast<size_t>(t) * H + h] = base + h * hs;
          for (int d = 0; d < D; ++d) {
            in.query[(static_cast<size_t>(t) * H + h) * D + d] =
                b.query.set(base + h * hs + d, rng.uniform(-1.0, 1.0));
          }
        }
      }
    }
    p.query = ragged ? TensorView::strided(b.query.data(), c.q_dtype, {T, H, D}, {ts, hs, 1})
                     : TensorView::strided(b.query.data(), c.q_dtype, {B, c.q_len, H, D},
                                           {bs, ts, hs, 1});
  }

  // KV pool. Dense: each request's pages are drawn from a random permutation of the pool, plus a
  // few pages nobody uses. Sparse: one pool, a quarter of its rows NaN.
  const int ps = c.page_size;
  std::vector<bool> row_live;  // [P * ps]
  if (!sparse) {
    int needed_total = 0, needed_max = 0;
    for (int r = 0; r < B; ++r) {
      const int n = ceil_div(std::max(c.seq_lens[r], 0), ps);
      needed_total += n;
      needed_max = std::max(needed_max, n);
    }
    b.num_pages = needed_total + 3;
    std::vector<int32_t> perm(b.num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.engine());
    b.max_pages = needed_max + 2;
    b.block_table_stride = b.max_pages + 5 * pad;
    b.block_tables.assign(std::max<int64_t>(B * b.block_table_stride, 1), 0);
    for (size_t k = 0; k < b.block_tables.size(); ++k) {
      b.block_tables[k] = (k % 2) ? -7 : b.num_pages + 100;  // never a valid page
    }
    row_live.assign(static_cast<size_t>(b.num_pages) * ps, false);
    int next = 0;
    for (int r = 0; r < B; ++r) {
      for (int j = 0; j < c.seq_lens[r]; ++j) {
        if (j % ps == 0) b.block_tables[r * b.block_table_stride + j / ps] = perm[next++];
        row_live[static_cast<size_t>(b.block_tables[r * b.block_table_stride + j / ps]) * ps +
                 j % ps] = true;
      }
    }
    in.max_pages = static_cast<int>(b.max_pages);
    in.block_tables.assign(static_cast<size_t>(B) * b.max_pages, 0);
    for (int r = 0; r < B; ++r) {
      for (int k = 0; k < b.max_pages; ++k) {
        in.block_tables[r * b.max_pages + k] = b.block_tables[r * b.block_table_stride + k];
      }
    }
    p.block_tables = TensorView::strided(b.block_tables.data(), dt::kInt32, {B, b.max_pages},
                                         {b.block_table_stride, 1});
  } else {
    const int pool_rows = 3 * c.top_k + 50;
    b.num_pages = ceil_div(pool_rows, ps);
    row_live.assign(static_cast<size_t>(b.num_pages) * ps, false);
    for (size_t k = 0; k < row_live.size(); ++k) row_live[k] = rng.coin(0.75);
  }
  in.num_pages = b.num_pages;
  {
    const int64_t rs = D + 16 * pad, pgs = ps * rs + 32 * pad;
    b.kv = Buffer(c.kv_dtype, b.num_pages * pgs);
    b.kv_page_stride = pgs;
    b.kv_row_stride = rs;
    in.kv.assign(static_cast<size_t>(b.num_pages) * ps * D, std::nan(""));
    for (size_t slot = 0; slot < row_live.size(); ++slot) {
      if (!row_live[slot]) continue;
      const int64_t base =
          static_cast<int64_t>(slot / ps) * pgs + static_cast<int64_t>(slot % ps) * rs;
      for (int d = 0; d < D; ++d) in.kv[slot * D + d] = b.kv.set(base + d, rng.uniform(-1.0, 1.0));
    }
    p.kv_cache =
        c.kv4d ? TensorView::strided(b.kv.data(), c.kv_dtype, {b.num_pages, 1, ps, D},
                                     {pgs, ps * rs, rs, 1})
               : TensorView::strided(b.kv.data(), c.kv_dtype, {b.num_pages, ps, D}, {pgs, rs, 1});
  }

  b.seq_lens = c.seq_lens;
  p.seq_lens = TensorView::contiguous(b.seq_lens.data(), dt::kInt32, {B});
  if (ragged) {
    b.cum_seq_lens_q.assign(first.begin(), first.end());
    p.cum_seq_lens_q = TensorView::contiguous(b.cum_seq_lens_q.data(), dt::kInt32, {B + 1});
    if (c.max_q_len_hint) p.max_q_len = max_n;
  }

  // Custom mask: random bits, with some rows all clear or all set; bits past the query tokens name
  // no key and are random too.
  if (c.mask != Mask::kNone) {
    const int W = ceil_div(max_n, 32);
    b.mask.resize(std::max(T * W, 1));
    for (int t = 0; t < T; ++t) {
      const int kind = rng.randint(0, 6);
      for (int w = 0; w < W; ++w) {
        b.mask[t * W + w] = kind == 0 ? 0u : kind == 1 ? ~0u : rng.bits32();
      }
    }
    in.has_mask = true;
    in.mask_words = W;
    in.mask.assign(b.mask.begin(), b.mask.begin() + T * W);
    const bool u16 = c.mask == Mask::kU16;
    const DataType mdt = u16 ? dt::kUInt16 : dt::kUInt32;
    const int64_t words = u16 ? 2 * W : W;
    p.mask = ragged ? TensorView::contiguous(b.mask.data(), mdt, {T, words})
                    : TensorView::contiguous(b.mask.data(), mdt, {B, c.q_len, words});
  }

  if (c.sinks) {
    b.sinks.resize(H);
    in.has_sinks = true;
    for (int h = 0; h < H; ++h) {
      b.sinks[h] = static_cast<float>(rng.uniform(c.sink_lo, c.sink_hi));
      in.sinks.push_back(b.sinks[h]);
    }
    p.sinks = TensorView::contiguous(b.sinks.data(), dt::kFloat32, {H});
  }

  // Sparse lists: leading `len` entries pick live rows, with -1 holes and duplicates; entries past
  // `len` point at NaN rows or live rows, so using them shows.
  if (sparse) {
    const int K = c.top_k;
    in.sparse = true;
    in.top_k = K;
    in.topk_lens_mode = c.topk_lens;
    std::vector<int32_t> live, dead;
    for (size_t k = 0; k < row_live.size(); ++k)
      (row_live[k] ? live : dead).push_back(static_cast<int32_t>(k));
    if (dead.empty()) dead.push_back(live.front());
    std::vector<int> lens(T, K);
    if (c.topk_lens == oracle::TopkLens::kPerRequest) {
      b.topk_lens.resize(B);
      for (int r = 0; r < B; ++r) {
        b.topk_lens[r] = r == 1 ? 0 : rng.randint(0, K);
        for (int i = 0; i < b.q_lens[r]; ++i) lens[token(r, i)] = b.topk_lens[r];
      }
      p.sparse_topk_lens = TensorView::contiguous(b.topk_lens.data(), dt::kInt32, {B});
    } else if (c.topk_lens == oracle::TopkLens::kPerToken) {
      b.topk_lens.resize(std::max(T, 1));
      for (int t = 0; t < T; ++t) lens[t] = b.topk_lens[t] = t == 1 ? 0 : rng.randint(0, K);
      p.sparse_topk_lens =
          ragged ? TensorView::contiguous(b.topk_lens.data(), dt::kInt32, {T})
                 : TensorView::contiguous(b.topk_lens.data(), dt::kInt32, {B, c.q_len});
    }
    in.topk_lens.assign(b.topk_lens.begin(), b.topk_lens.end());
    b.sparse_indices.resize(std::max(T * K, 1));
    for (int t = 0; t < T; ++t) {
      const bool all_holes = t == 2;  // a list of -1 only
      for (int e = 0; e < K; ++e) {
        int32_t& slot = b.sparse_indices[t * K + e];
        if (e < lens[t]) {
          const double u = rng.uniform(0.0, 1.0);
          if (all_holes || u < 0.1) {
            slot = -1;
          } else if (u < 0.2 && e > 0) {
            slot = b.sparse_indices[t * K + rng.randint(0, e - 1)];  // a duplicate (or a -1)
          } else {
            slot = live[rng.randint(0, static_cast<int>(live.size()) - 1)];
          }
        } else {
          // Past the counted entries: a NaN row, a live row, or a slot past the pool, none of
          // which may be read.
          const int pick = rng.randint(0, 2);
          slot = pick == 0   ? dead[rng.randint(0, static_cast<int>(dead.size()) - 1)]
                 : pick == 1 ? live[rng.randint(0, static_cast<int>(live.size()) - 1)]
                             : static_cast<int32_t>(b.num_pages) * c.page_size + 7 + e;
        }
      }
    }
    in.sparse_indices.assign(b.sparse_indices.begin(), b.sparse_indices.begin() + T * K);
    p.sparse_top_k = K;
    p.sparse_indices =
        ragged ? TensorView::contiguous(b.sparse_indices.data(), dt::kInt32, {T, K})
               : TensorView::contiguous(b.sparse_indices.data(), dt::kInt32, {B, c.q_len, K});
  }

  // Scales. As tensors, the host floats hold garbage that must be ignored.
  const float bmm1 = static_cast<float>(c.bmm1 != 0.0 ? c.bmm1 : 4.0 / std::sqrt(double(D)));
  const float bmm2 = static_cast<float>(c.bmm2);
  in.bmm1_scale = bmm1;
  in.bmm2_scale = bmm2;
  if (c.scale_tensors) {
    b.bmm1_value = bmm1;
    b.bmm2_value = bmm2;
    p.bmm1_scale = 123.0f;
    p.bmm2_scale = -7.0f;
    p.bmm1_scale_tensor = TensorView::contiguous(&b.bmm1_value, dt::kFloat32, {1});
    p.bmm2_scale_tensor = TensorView::contiguous(&b.bmm2_value, dt::kFloat32, {1});
  } else {
    p.bmm1_scale = bmm1;
    p.bmm2_scale = bmm2;
  }
  p.skip_softmax_threshold_scale_factor = c.skip;
  in.skip_softmax_factor = c.skip;

  // Outputs, poisoned; out may be padded.
  {
    const int odd = c.out_odd ? 1 : 0, quad = c.out_quad ? 4 : 0;
    const int64_t hs = L + 8 * pad + 3 * odd + quad, ts = H * hs + 24 * pad + odd + quad,
                  bs = c.q_len * ts + 40 * pad + odd + quad;
    b.out = Buffer(c.out_dtype, ragged ? T * ts : B * bs);
    b.out_logical.assign(b.out.count(), false);
    b.out_row.assign(static_cast<size_t>(T) * H, 0);
    for (int r = 0; r < B; ++r) {
      for (int i = 0; i < b.q_lens[r]; ++i) {
        const int t = token(r, i);
        for (int h = 0; h < H; ++h) {
          const int64_t row = (ragged ? t * ts : r * bs + i * ts) + h * hs;
          b.out_row[static_cast<size_t>(t) * H + h] = row;
          for (int l = 0; l < L; ++l) b.out_logical[row + l] = true;
        }
      }
    }
    p.out = ragged ? TensorView::strided(b.out.data(), c.out_dtype, {T, H, L}, {ts, hs, 1})
                   : TensorView::strided(b.out.data(), c.out_dtype, {B, c.q_len, H, L},
                                         {bs, ts, hs, 1});
  }
  if (c.lse) {
    b.lse = Buffer(dt::kFloat32, static_cast<int64_t>(T) * H);
    p.lse = ragged ? TensorView::contiguous(b.lse.data(), dt::kFloat32, {T, H})
                   : TensorView::contiguous(b.lse.data(), dt::kFloat32, {B, c.q_len, H});
  } else {
    b.lse = Buffer(dt::kFloat32, 0);
  }

  // Workspace: sized by the library, filled with garbage.
  const size_t workspace_bytes = mla::workspace_size(p);
  b.workspace.resize(std::max<size_t>(workspace_bytes, 1));
  p.workspace = TensorView::contiguous(b.workspace.data(), dt::kUInt8,
                                       {static_cast<int64_t>(workspace_bytes)});
  b.reset_outputs(c.seed + 99);
  return bp;
}

// Runs the call; reports mla::Error text on failure.
inline ::testing::AssertionResult run_decode(const mla::DecodeParams& params) {
  try {
    mla::decode(params);
  } catch (const mla::Error& e) {
    return ::testing::AssertionFailure()
           << "mla::Error (" << mla::error_code_name(e.code()) << "): " << e.what();
  }
  return ::testing::AssertionSuccess();
}

// `extra` with, where the kernel rounds P to fp16 (fp16_p), twice the oracle's fp16_p_abs added
// to each finite row's out_abs: fp16's subnormal range, which OutTolerance::p_rel does not cover.
inline mla_test::RowAllowance with_fp16_p(const oracle::Output& ref, int64_t rows,
                                          const mla_test::RowAllowance* extra) {
  mla_test::RowAllowance a;
  if (extra != nullptr) a = *extra;
  if (a.out_abs.empty()) a.out_abs.assign(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (std::isfinite(ref.fp16_p_abs[r])) a.out_abs[r] += 2 * ref.fp16_p_abs[r];
  }
  return a;
}

// Every out and lse element against the oracle, and out's padding untouched. `p_rel`: the
// allowance for probabilities rounded to 16 bits (mla_test::OutTolerance); 0 for fp32 P. `extra`
// (optional): per-row allowances for inputs the kernel rounds (mla_test::RowAllowance). `fp16_p`:
// P is rounded to fp16 (with_fp16_p).
inline void check_against_oracle(const Built& b, double p_rel = 0.0,
                                 const mla_test::RowAllowance* extra = nullptr,
                                 bool fp16_p = false) {
  const oracle::Output ref = oracle::reference(b.in);
  const int64_t rows = static_cast<int64_t>(b.T) * b.c.H;
  mla_test::RowAllowance with_p;
  if (fp16_p) {
    with_p = with_fp16_p(ref, rows, extra);
    extra = &with_p;
  }
  const int L = b.c.L;
  double worst_out = 0.0, worst_lse = 0.0;
  mla_test::OutTolerance tol = mla_test::out_tolerance(b.c.out_dtype);
  tol.p_rel = p_rel;
  EXPECT_TRUE(mla_test::compare_rows(
      "out", rows, L, tol, [&](int64_t r, int64_t l) { return b.out.get(b.out_row[r] + l); },
      [&](int64_t r, int64_t l) { return ref.out[r * L + l]; },
      [&](int64_t r, int64_t l) { return ref.out_abs[r * L + l]; },
      [&](int64_t r) { return std::isinf(ref.lse[r]); }, &worst_out, extra));
  if (b.c.lse) {
    EXPECT_TRUE(mla_test::compare_lse(
        rows, [&](int64_t r) { return b.lse.get(r); }, [&](int64_t r) { return ref.lse[r]; },
        &worst_lse, extra));
  }
  // How close to the tolerance each case runs (in the XML report), to keep them calibrated.
  ::testing::Test::RecordProperty("worst_out_err_over_allowed", std::to_string(worst_out));
  ::testing::Test::RecordProperty("worst_lse_err_over_allowed", std::to_string(worst_lse));
  int64_t touched = 0;
  for (int64_t i = 0; i < b.out.count(); ++i) {
    if (!b.out_logical[i] && !b.out.is_poison(i)) ++touched;
  }
  EXPECT_EQ(touched, 0) << "out padding elements written";
}

// ---- The checked mode's cases ---------------------------------------------------------------

// Three requests (one without keys) of two query tokens and pages of 16: the bad-index tests
// corrupt one entry of its index tensors.
inline Case small_index_case() {
  Case c;
  c.B = 3;
  c.H = 3;
  c.q_len = 2;
  c.seq_lens = {40, 0, 20};
  c.page_size = 16;
  return c;
}

// ---- Separate K/V page tables (docs/contract.md section 3) --------------------------------------

// Copies the case's [B, max_pages] table into a [B, 2, max_pages] one (rows padded by `pad`,
// requests by 2 * pad); entries past the needed pages differ between the rows and are invalid.
inline std::vector<int32_t> kv_page_tables(const Built& b, int pad) {
  const int64_t mp = b.max_pages, row = mp + pad, request = 2 * row + 2 * pad;
  std::vector<int32_t> t(static_cast<size_t>(std::max<int64_t>(b.c.B * request, 1)), -3);
  for (int r = 0; r < b.c.B; ++r) {
    const int64_t needed = (std::max(b.c.seq_lens[r], 0) + b.c.page_size - 1) / b.c.page_size;
    for (int64_t k = 0; k < mp; ++k) {
      const int32_t page = b.block_tables[r * b.block_table_stride + k];
      t[r * request + k] = page;
      t[r * request + row + k] = k < needed ? page : -9;
    }
  }
  return t;
}

// ---- Non-finite inputs (docs/contract.md section 1)
// ----------------------------------------------------

// Writes `bits` (dtype_bytes(dt) bytes, little-endian) at element `index` of `buffer`.
inline void store_bits(Buffer& buffer, int64_t index, uint32_t bits) {
  const size_t bytes = mla_test::dtype_bytes(buffer.dtype());
  std::memcpy(static_cast<uint8_t*>(buffer.data()) + index * static_cast<int64_t>(bytes), &bits,
              bytes);
}

// The bits of +inf in a 16/32-bit float dtype (fp8 e4m3fn has no inf: NaN instead).
inline uint32_t inf_bits(DataType dt) {
  if (dt == dt::kBFloat16) return 0x7f80u;
  if (dt == dt::kFloat16) return 0x7c00u;
  if (dt == dt::kFloat32) return 0x7f800000u;
  return mla_test::nan_bits(dt);
}

// Element d of query row (t, h) becomes NaN (or +inf), in the tensor and the oracle.
inline void poison_query(Built& b, int t, int h, int d, bool inf = false) {
  const DataType qt = b.c.q_dtype;
  store_bits(b.query, b.q_row[static_cast<size_t>(t) * b.c.H + h] + d,
             inf ? inf_bits(qt) : mla_test::nan_bits(qt));
  b.in.query[(static_cast<size_t>(t) * b.c.H + h) * b.D + d] =
      inf ? std::numeric_limits<double>::infinity() : std::nan("");
}

// Element d of key j of request r (dense mode) becomes NaN (or +inf), in the tensor and the
// oracle.
inline void poison_key(Built& b, int r, int j, int d, bool inf = false) {
  const DataType kt = b.c.kv_dtype;
  const int64_t page = b.block_tables[r * b.block_table_stride + j / b.c.page_size];
  const int64_t slot = page * b.c.page_size + j % b.c.page_size;
  store_bits(b.kv, page * b.kv_page_stride + (j % b.c.page_size) * b.kv_row_stride + d,
             inf ? inf_bits(kt) : mla_test::nan_bits(kt));
  b.in.kv[slot * b.D + d] =
      (inf && kt != dt::kFloat8E4M3) ? std::numeric_limits<double>::infinity() : std::nan("");
}

// out and lse filled with a finite value, so that a row left unwritten cannot pass for NaN.
inline void fill_outputs(Built& b, double value) {
  for (int64_t i = 0; i < b.out.count(); ++i) b.out.set(i, value);
  for (int64_t i = 0; i < b.lse.count(); ++i) b.lse.set(i, value);
}

// check_against_oracle for calls with non-finite inputs: rows whose reference is NaN must be NaN
// in every out element and in lse; every other row is compared as check_against_oracle does.
// `p_rel`, `extra` and `fp16_p` as for check_against_oracle. Returns the number of NaN rows.
inline int64_t check_nan_rows_against_oracle(const Built& b, double p_rel = 0.0,
                                             const mla_test::RowAllowance* extra = nullptr,
                                             bool fp16_p = false) {
  const oracle::Output ref = oracle::reference(b.in);
  const int64_t rows = static_cast<int64_t>(b.T) * b.c.H;
  mla_test::RowAllowance with_p;
  if (fp16_p) {
    with_p = with_fp16_p(ref, rows, extra);
    extra = &with_p;
  }
  const int L = b.c.L;
  std::vector<bool> nan_row(rows);
  int64_t nan_rows = 0;
  for (int64_t r = 0; r < rows; ++r) {
    nan_row[r] = std::isnan(ref.lse[r]);
    nan_rows += nan_row[r];
    if (!nan_row[r]) continue;
    int64_t finite = 0;
    for (int l = 0; l < L; ++l) finite += !std::isnan(b.out.get(b.out_row[r] + l));
    EXPECT_EQ(finite, 0) << "out row " << r << ": expected NaN (a non-finite input touches it)";
    if (b.c.lse) {
      EXPECT_TRUE(std::isnan(b.lse.get(r))) << "lse row " << r << ": expected NaN";
    }
  }
  // The NaN rows are left out of the comparison (0 against 0).
  mla_test::OutTolerance tol = mla_test::out_tolerance(b.c.out_dtype);
  tol.p_rel = p_rel;
  EXPECT_TRUE(mla_test::compare_rows(
      "out", rows, L, tol,
      [&](int64_t r, int64_t l) { return nan_row[r] ? 0.0 : b.out.get(b.out_row[r] + l); },
      [&](int64_t r, int64_t l) { return nan_row[r] ? 0.0 : ref.out[r * L + l]; },
      [&](int64_t r, int64_t l) { return nan_row[r] ? 0.0 : ref.out_abs[r * L + l]; },
      [&](int64_t r) { return nan_row[r] || std::isinf(ref.lse[r]); }, nullptr, extra));
  if (b.c.lse) {
    EXPECT_TRUE(mla_test::compare_lse(
        rows, [&](int64_t r) { return nan_row[r] ? 0.0 : b.lse.get(r); },
        [&](int64_t r) { return nan_row[r] ? 0.0 : ref.lse[r]; }, nullptr, extra));
  }
  return nan_rows;
}

// ---- Sparse calls (docs/contract.md section 2.2) ---------------------------------------------

// Element offset in b.kv of pool row `slot` (page * page_size + offset).
inline int64_t slot_offset(const Built& b, int64_t slot) {
  return (slot / b.c.page_size) * b.kv_page_stride + (slot % b.c.page_size) * b.kv_row_stride;
}

// The attended slots of every query token of a sparse call, by global token (the oracle's sets:
// counted entries other than -1, duplicates kept).
inline std::vector<std::vector<int64_t>> attended_by_token(const Built& b) {
  std::vector<std::vector<int64_t>> sets;
  for (int r = 0; r < b.c.B; ++r) {
    for (int i = 0; i < b.q_lens[r]; ++i) sets.push_back(oracle::attended_slots(b.in, r, i));
  }
  return sets;
}

// How many query tokens attend `slot` (each token once, however often its entries name it).
inline int tokens_attending(const Built& b, int64_t slot) {
  int n = 0;
  for (const std::vector<int64_t>& set : attended_by_token(b)) {
    n += std::find(set.begin(), set.end(), slot) != set.end();
  }
  return n;
}

// Element d of pool row `slot` becomes NaN (or +inf), in the tensor and the oracle (poison_key
// for sparse calls, whose keys are named by slot).
inline void poison_slot(Built& b, int64_t slot, int d, bool inf = false) {
  const DataType kt = b.c.kv_dtype;
  store_bits(b.kv, slot_offset(b, slot) + d, inf ? inf_bits(kt) : mla_test::nan_bits(kt));
  b.in.kv[slot * b.D + d] =
      (inf && kt != dt::kFloat8E4M3) ? std::numeric_limits<double>::infinity() : std::nan("");
}

// Every pool row that no token's counted entries name becomes NaN, in the tensor and the oracle
// (build() leaves a quarter of the pool NaN; this also takes the live rows that only entries past
// a count, or none, name): a kernel that reads a row it was not given, past the count, for a -1
// or at a wrong page or offset, turns its rows NaN.
inline void poison_unnamed_slots(Built& b) {
  const int64_t pool = static_cast<int64_t>(b.num_pages) * b.c.page_size;
  std::vector<bool> named(static_cast<size_t>(pool), false);
  for (const std::vector<int64_t>& set : attended_by_token(b)) {
    for (int64_t slot : set) named[slot] = true;
  }
  const uint32_t nan = mla_test::nan_bits(b.c.kv_dtype);
  for (int64_t slot = 0; slot < pool; ++slot) {
    if (named[slot]) continue;
    for (int d = 0; d < b.D; ++d) {
      store_bits(b.kv, slot_offset(b, slot) + d, nan);
      b.in.kv[slot * b.D + d] = std::nan("");
    }
  }
}

}  // namespace mla_test::decode_case
