// Hand-computed cases that check the oracle itself, and the element codecs the tests build on.
#include "oracle/oracle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "common/test_util.h"

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One head, L = 1, R = 1, a single request. Key rows (D = 2): k0 = [2, 0] (v0 = 2) and k1 = [0, 1]
// (v1 = 0), each on its own page of size 1, physical pages in reverse order: logical key j sits in
// pool row 1 - j. With q = [0, ln 3] the scores are s0 = 0 and s1 = ln 3, so p = (1/4, 3/4).
oracle::Input two_keys(int seq_len, int q_len) {
  oracle::Input in;
  in.batch = 1;
  in.num_heads = 1;
  in.kv_lora_rank = 1;
  in.rope_dim = 1;
  in.q_lens = {q_len};
  for (int i = 0; i < q_len; ++i) {
    in.query.push_back(0.0);
    in.query.push_back(std::log(3.0));
  }
  in.page_size = 1;
  in.num_pages = 2;
  in.kv = {0.0, 1.0, /* pool row 1 = key 0: */ 2.0, 0.0};
  in.max_pages = 3;
  in.block_tables = {1, 0, -7};  // the third slot is never needed
  in.seq_lens = {seq_len};
  return in;
}

TEST(Oracle, TwoKeysKnownNumbers) {
  oracle::Input in = two_keys(2, 1);
  oracle::Output r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 0.25 * 2 + 0.75 * 0, 1e-15);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-15);

  in.bmm2_scale = 2.0;
  r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 1.0, 1e-15);

  // bmm1_scale multiplies the scores: s = (0, 2 ln 3), p = (1/10, 9/10).
  in.bmm1_scale = 2.0;
  in.bmm2_scale = 1.0;
  r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 0.2, 1e-15);
  EXPECT_NEAR(r.lse[0], std::log(10.0), 1e-15);
}

TEST(Oracle, SinkShrinksOutButNotLse) {
  oracle::Input in = two_keys(2, 1);
  in.has_sinks = true;
  in.sinks = {std::log(4.0)};  // m = ln 4 > ln 3; Z = (1 + 3 + 4) / 4
  oracle::Output r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 2.0 / 8.0, 1e-15);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-15);

  in.sinks = {-1e4};  // a negligible sink changes nothing
  r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 0.5, 1e-15);
}

TEST(Oracle, OutAbsSumsMagnitudes) {
  // v1 = -2 instead of 0: out = (1 * 2 + 3 * -2) / 4 = -1, out_abs = (2 + 6) / 4 = 2.
  oracle::Input in = two_keys(2, 1);
  in.kv[0] = -2.0;  // pool row 0 = key 1
  in.bmm2_scale = -0.5;
  oracle::Output r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 0.5, 1e-15);
  EXPECT_NEAR(r.out_abs[0], 1.0, 1e-15);

  in.has_sinks = true;
  in.sinks = {std::log(4.0)};  // Z = (1 + 3 + 4) / 4: both shrink by half
  r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 0.25, 1e-15);
  EXPECT_NEAR(r.out_abs[0], 0.5, 1e-15);

  r = oracle::reference(two_keys(0, 1));  // empty set
  EXPECT_EQ(r.out_abs[0], 0.0);
}

TEST(Oracle, Fp16PAbsCountsTheKeysBelowFp16sNormalRange) {
  // q = [0, x]: s0 = 0 (v0 = 2), s1 = x (v1 = 0) the max, so e0 = exp(-x).
  auto with_gap = [](double x) {
    oracle::Input in = two_keys(2, 1);
    in.query[1] = x;
    return in;
  };
  oracle::Output r = oracle::reference(with_gap(5.0));  // e0 ~ 6.7e-3, above 2^-14: nothing
  EXPECT_EQ(r.fp16_p_abs[0], 0.0);
  r = oracle::reference(with_gap(12.0));  // e0 ~ 6.1e-6, in [2^-25, 2^-14): half fp16's spacing
  EXPECT_NEAR(r.fp16_p_abs[0], 2.0 * std::ldexp(1.0, -25) / (1.0 + std::exp(-12.0)), 1e-22);
  oracle::Input in = with_gap(20.0);  // e0 ~ 2.1e-9, below 2^-25: e0 itself
  in.bmm2_scale = -3.0;
  r = oracle::reference(in);
  EXPECT_NEAR(r.fp16_p_abs[0], 3.0 * 2.0 * std::exp(-20.0) / (1.0 + std::exp(-20.0)), 1e-22);
  in.query[0] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(oracle::reference(in).fp16_p_abs[0]));
  EXPECT_EQ(oracle::reference(two_keys(0, 1)).fp16_p_abs[0], 0.0);  // empty set
}

TEST(Oracle, EmptySetGivesZeroAndMinusInf) {
  oracle::Input in = two_keys(0, 1);
  oracle::Output r = oracle::reference(in);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.lse[0], -kInf);

  in.has_sinks = true;  // a sink alone attends nothing either
  in.sinks = {3.0};
  r = oracle::reference(in);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.lse[0], -kInf);
}

TEST(Oracle, CausalAndPositionsBelowZero) {
  // seq_len 2, two query tokens at positions 0 and 1.
  oracle::Input in = two_keys(2, 2);
  oracle::Output r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 2.0, 1e-15);  // token 0 sees key 0 only
  EXPECT_NEAR(r.lse[0], 0.0, 1e-15);
  EXPECT_NEAR(r.out[1], 0.5, 1e-15);  // token 1 sees both
  EXPECT_NEAR(r.lse[1], std::log(4.0), 1e-15);

  // seq_len 1, two query tokens at positions -1 and 0.
  in = two_keys(1, 2);
  r = oracle::reference(in);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.lse[0], -kInf);
  EXPECT_NEAR(r.out[1], 2.0, 1e-15);
  EXPECT_NEAR(r.lse[1], 0.0, 1e-15);
}

TEST(Oracle, MaskBits) {
  // Three keys: v = (2, 0, 6); scores s = (0, ln 3, 0). Two query tokens, first query position 1:
  // key 0 is always attended, key 1 is bit 0 and key 2 is bit 1 of the token's mask row.
  oracle::Input in = two_keys(3, 2);
  in.num_pages = 3;
  in.kv = {0.0, 1.0, 2.0, 0.0, 6.0, 0.0};
  in.block_tables = {1, 0, 2};
  in.has_mask = true;
  in.mask_words = 1;
  in.mask = {0b10u | 0xffff0000u, 0b00u};  // bits past the query tokens name no key
  oracle::Output r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], (2.0 + 6.0) / 2.0, 1e-15);  // keys {0, 2}, equal scores
  EXPECT_NEAR(r.lse[0], std::log(2.0), 1e-15);
  EXPECT_NEAR(r.out[1], 2.0, 1e-15);  // key 0 only, although causal would allow key 1
  EXPECT_NEAR(r.lse[1], 0.0, 1e-15);

  EXPECT_EQ(oracle::attended_slots(in, 0, 0), (std::vector<int64_t>{1, 2}));
  in.mask = {0b11u, 0b01u};  // mask replaces causal: token 0 may see key 2
  EXPECT_EQ(oracle::attended_slots(in, 0, 0), (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(oracle::attended_slots(in, 0, 1), (std::vector<int64_t>{1, 0}));
}

TEST(Oracle, MaskSecondWord) {
  // 40 query tokens, seq_len 40: key j is bit j; token 0 selects key 33 only (word 1, bit 1).
  oracle::Input in;
  in.batch = 1;
  in.num_heads = 1;
  in.kv_lora_rank = 1;
  in.rope_dim = 1;
  in.q_lens = {40};
  in.query.assign(80, 0.0);
  in.page_size = 64;
  in.num_pages = 1;
  in.kv.assign(128, 0.0);
  for (int j = 0; j < 40; ++j) in.kv[2 * j] = j;
  in.max_pages = 1;
  in.block_tables = {0};
  in.seq_lens = {40};
  in.has_mask = true;
  in.mask_words = 2;
  in.mask.assign(80, 0u);
  in.mask[1] = 0b10u;
  oracle::Output r = oracle::reference(in);
  EXPECT_EQ(r.out[0], 33.0);
  EXPECT_EQ(r.lse[0], 0.0);
  EXPECT_EQ(r.lse[1], -kInf);  // token 1's row is all zero
}

TEST(Oracle, SparseListsWithDuplicatesAndHoles) {
  oracle::Input in = two_keys(2, 1);
  in.sparse = true;
  in.top_k = 4;
  in.sparse_indices = {0, -1, 0, 1};  // pool row 0 is key 1 (s = ln 3), pool row 1 is key 0
  in.block_tables.clear();
  in.seq_lens = {4};  // the causal bound seq_len - n + i + 1 = 4 counts every entry
  oracle::Output r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 2.0 / 7.0, 1e-15);  // weights 3, 3, 1 on v = 0, 0, 2
  EXPECT_NEAR(r.lse[0], std::log(7.0), 1e-15);

  in.topk_lens_mode = oracle::TopkLens::kPerRequest;
  in.topk_lens = {3};  // entries {0, -1, 0}
  r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 0.0, 1e-15);
  EXPECT_NEAR(r.lse[0], std::log(6.0), 1e-15);

  in.topk_lens_mode = oracle::TopkLens::kPerToken;
  in.topk_lens = {2};  // entries {0, -1}
  EXPECT_EQ(oracle::attended_slots(in, 0, 0), (std::vector<int64_t>{0}));
  in.topk_lens = {0};
  r = oracle::reference(in);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.lse[0], -kInf);

  in.topk_lens_mode = oracle::TopkLens::kNone;
  in.sparse_indices = {0, 2, 0, 0};  // pool has 2 rows
  EXPECT_THROW(oracle::reference(in), std::out_of_range);
}

// Sparse token i counts its first min(top_k, topk_len, seq_len - n + i + 1) entries.
TEST(Oracle, SparseCausalBound) {
  oracle::Input in = two_keys(2, 2);  // two query tokens
  in.sparse = true;
  in.top_k = 3;
  in.sparse_indices = {1, 0, 0, /* token 1: */ 0, 1, 1};
  in.block_tables.clear();
  in.seq_lens = {3};  // token 0 counts 2 entries, token 1 all 3
  EXPECT_EQ(oracle::attended_slots(in, 0, 0), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(oracle::attended_slots(in, 0, 1), (std::vector<int64_t>{0, 1, 1}));
  oracle::Output r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 0.5, 1e-15);  // weights 1 (v 2), 3 (v 0)
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-15);
  EXPECT_NEAR(r.out[1], 4.0 / 5.0, 1e-15);  // weights 3, 1, 1 on v = 0, 2, 2
  EXPECT_NEAR(r.lse[1], std::log(5.0), 1e-15);

  in.seq_lens = {1};  // token 0: 1 - 2 + 0 + 1 = 0 entries, token 1: 1
  EXPECT_TRUE(oracle::attended_slots(in, 0, 0).empty());
  EXPECT_EQ(oracle::attended_slots(in, 0, 1), (std::vector<int64_t>{0}));
  r = oracle::reference(in);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.lse[0], -kInf);
  EXPECT_NEAR(r.lse[1], std::log(3.0), 1e-15);

  in.seq_lens = {0};  // no token sees any key
  EXPECT_TRUE(oracle::attended_slots(in, 0, 1).empty());

  in.seq_lens = {9};  // topk_len binds before seq_len
  in.topk_lens_mode = oracle::TopkLens::kPerToken;
  in.topk_lens = {1, 2};
  EXPECT_EQ(oracle::attended_slots(in, 0, 0), (std::vector<int64_t>{1}));
  EXPECT_EQ(oracle::attended_slots(in, 0, 1), (std::vector<int64_t>{0, 1}));
}

// A NaN or inf in the query row, an attended key (value part included) or a scale makes exactly
// the rows it touches NaN; keys that are not attended and empty rows are unaffected.
TEST(Oracle, NonFiniteInputsPropagateToTheRowsTheyTouch) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto expect_nan = [](const oracle::Output& r, size_t row) {
    EXPECT_TRUE(std::isnan(r.out[row])) << row;
    EXPECT_TRUE(std::isnan(r.lse[row])) << row;
  };
  // Token 0 sees key 0 (pool row 1), token 1 sees keys 0 and 1.
  oracle::Input in = two_keys(2, 2);
  in.query[2] = nan;  // token 1's query row
  oracle::Output r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 2.0, 1e-15);
  expect_nan(r, 1);

  in = two_keys(2, 2);
  in.kv[0] = kInf;  // key 1's value, attended by token 1 only
  r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 2.0, 1e-15);
  expect_nan(r, 1);

  in = two_keys(2, 2);
  in.kv[3] = -kInf;  // key 0's rope part: both tokens
  r = oracle::reference(in);
  expect_nan(r, 0);
  expect_nan(r, 1);

  in = two_keys(1, 1);
  in.kv[0] = nan;  // key 1 lies past seq_len: not attended
  r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 2.0, 1e-15);
  EXPECT_NEAR(r.lse[0], 0.0, 1e-15);

  for (double scale : {nan, kInf, -kInf}) {
    in = two_keys(2, 1);
    in.bmm1_scale = scale;
    expect_nan(oracle::reference(in), 0);
    in = two_keys(2, 1);
    in.bmm2_scale = scale;
    expect_nan(oracle::reference(in), 0);
    in = two_keys(0, 1);  // nothing attended: empty, whatever the scale
    in.bmm1_scale = scale;
    r = oracle::reference(in);
    EXPECT_EQ(r.out[0], 0.0);
    EXPECT_EQ(r.lse[0], -kInf);
  }
}

// R = 0: the key is the value row alone.
TEST(Oracle, NoRopePart) {
  oracle::Input in;
  in.batch = 1;
  in.num_heads = 1;
  in.kv_lora_rank = 2;
  in.rope_dim = 0;
  in.q_lens = {1};
  in.query = {std::log(3.0), 0.0};
  in.page_size = 2;
  in.num_pages = 1;
  in.kv = {1.0, 0.0, /* key 1: */ 0.0, 4.0};  // scores ln 3 and 0
  in.max_pages = 1;
  in.block_tables = {0};
  in.seq_lens = {2};
  oracle::Output r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 0.75, 1e-15);
  EXPECT_NEAR(r.out[1], 1.0, 1e-15);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-15);
}

TEST(Oracle, LargeScoresStayFinite) {
  oracle::Input in = two_keys(2, 1);
  in.bmm1_scale = 1000.0;  // s = (0, 1000 ln 3): exp would overflow without the max subtraction
  oracle::Output r = oracle::reference(in);
  EXPECT_NEAR(r.out[0], 0.0, 1e-15);
  EXPECT_NEAR(r.lse[0], 1000.0 * std::log(3.0), 1e-9);
}

TEST(Oracle, RefusesToReadPastTheTable) {
  oracle::Input in = two_keys(2, 1);
  in.block_tables = {1, 5, 0};
  EXPECT_THROW(oracle::reference(in), std::out_of_range);
  in = two_keys(4, 1);  // needs logical page 3 of a 3-slot table
  EXPECT_THROW(oracle::reference(in), std::out_of_range);
}

TEST(Decoders, Fp8E4M3FN) {
  EXPECT_EQ(oracle::fp8_e4m3fn_to_double(0x38), 1.0);
  EXPECT_EQ(oracle::fp8_e4m3fn_to_double(0xb8), -1.0);
  EXPECT_EQ(oracle::fp8_e4m3fn_to_double(0x7e), 448.0);
  EXPECT_EQ(oracle::fp8_e4m3fn_to_double(0xfe), -448.0);
  EXPECT_EQ(oracle::fp8_e4m3fn_to_double(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(oracle::fp8_e4m3fn_to_double(0x07), 7 * std::ldexp(1.0, -9));
  EXPECT_EQ(oracle::fp8_e4m3fn_to_double(0x08), std::ldexp(1.0, -6));
  EXPECT_EQ(oracle::fp8_e4m3fn_to_double(0x3c), 1.5);
  EXPECT_EQ(oracle::fp8_e4m3fn_to_double(0x78), 256.0);  // no infinity in this format
  EXPECT_EQ(oracle::fp8_e4m3fn_to_double(0x00), 0.0);
  EXPECT_TRUE(std::signbit(oracle::fp8_e4m3fn_to_double(0x80)));
  EXPECT_TRUE(std::isnan(oracle::fp8_e4m3fn_to_double(0x7f)));
  EXPECT_TRUE(std::isnan(oracle::fp8_e4m3fn_to_double(0xff)));
}

// 656 bytes: 512 e4m3 values, 4 fp32 scales (little-endian), 64 bf16 rope values.
TEST(Decoders, Fp8DsMla) {
  std::vector<uint8_t> row(oracle::kFp8DsMlaRowBytes, 0);
  const float scales[4] = {0.5f, 2.0f, -1.0f, 0.0f};
  std::memcpy(&row[512], scales, sizeof(scales));
  row[0] = 0x38;    // 1.0, group 0
  row[127] = 0x3c;  // 1.5, group 0
  row[128] = 0x38;  // 1.0, group 1
  row[300] = 0x78;  // 256, group 2
  row[511] = 0x38;  // group 3 (scale 0)
  row[528] = 0x80;  // rope 0: bf16 0x3f80 = 1.0
  row[529] = 0x3f;
  row[654] = 0x00;  // rope 63: bf16 0xc000 = -2.0
  row[655] = 0xc0;
  std::vector<double> key(oracle::kFp8DsMlaValues);
  oracle::fp8_ds_mla_to_double(row.data(), key.data());
  EXPECT_EQ(key[0], 0.5);
  EXPECT_EQ(key[127], 0.75);
  EXPECT_EQ(key[128], 2.0);
  EXPECT_EQ(key[300], -256.0);
  EXPECT_EQ(key[511], 0.0);
  EXPECT_EQ(key[1], 0.0);
  EXPECT_EQ(key[512], 1.0);
  EXPECT_EQ(key[513], 0.0);
  EXPECT_EQ(key[575], -2.0);
  std::memset(&row[520], 0xff, 4);  // scale 2: a NaN
  oracle::fp8_ds_mla_to_double(row.data(), key.data());
  EXPECT_TRUE(std::isnan(key[300]));
  EXPECT_EQ(key[128], 2.0);
}

TEST(Decoders, Bf16AndFp16) {
  EXPECT_EQ(oracle::bf16_to_double(0x3f80), 1.0);
  EXPECT_EQ(oracle::bf16_to_double(0xc000), -2.0);
  EXPECT_EQ(oracle::bf16_to_double(0x3f81), 1.0 + std::ldexp(1.0, -7));
  EXPECT_EQ(oracle::bf16_to_double(0x7f80), kInf);
  EXPECT_TRUE(std::isnan(oracle::bf16_to_double(0x7fc0)));
  EXPECT_EQ(oracle::fp16_to_double(0x3c00), 1.0);
  EXPECT_EQ(oracle::fp16_to_double(0xc000), -2.0);
  EXPECT_EQ(oracle::fp16_to_double(0x7bff), 65504.0);
  EXPECT_EQ(oracle::fp16_to_double(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(oracle::fp16_to_double(0x0400), std::ldexp(1.0, -14));
  EXPECT_EQ(oracle::fp16_to_double(0x3555), 0.333251953125);
  EXPECT_EQ(oracle::fp16_to_double(0xfc00), -kInf);
  EXPECT_TRUE(std::isnan(oracle::fp16_to_double(0x7e00)));
  EXPECT_EQ(oracle::fp32_to_double(0x3f800000u), 1.0);
  EXPECT_EQ(oracle::fp32_to_double(0xc0490fdbu), -3.1415927410125732);
}

// The test-side encoders round to nearest even and invert the decoders on every finite code.
TEST(Encoders, InvertTheDecoders) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const double x = oracle::fp8_e4m3fn_to_double(static_cast<uint8_t>(c));
    EXPECT_EQ(mla_test::encode_fp8_e4m3fn(x), c) << x;
  }
  for (int c = 0; c < 65536; ++c) {
    if ((c & 0x7c00) == 0x7c00) continue;
    const double x = oracle::fp16_to_double(static_cast<uint16_t>(c));
    ASSERT_EQ(mla_test::encode_fp16(x), c) << x;
  }
  for (int c = 0; c < 65536; c += 7) {
    if ((c & 0x7f80) == 0x7f80) continue;
    const double x = oracle::bf16_to_double(static_cast<uint16_t>(c));
    ASSERT_EQ(mla_test::encode_bf16(x), c) << x;
  }
}

TEST(Encoders, RoundToNearestEven) {
  EXPECT_EQ(mla_test::encode_bf16(1.0 + std::ldexp(1.0, -8)), 0x3f80);        // tie -> even
  EXPECT_EQ(mla_test::encode_bf16(1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);    // tie -> even
  EXPECT_EQ(mla_test::encode_bf16(1.0 + 1.1 * std::ldexp(1.0, -8)), 0x3f81);  // above the tie
  EXPECT_EQ(mla_test::encode_fp16(1.0 + std::ldexp(1.0, -11)), 0x3c00);
  EXPECT_EQ(mla_test::encode_fp16(std::ldexp(1.0, -25)), 0x0000);      // tie -> even (0)
  EXPECT_EQ(mla_test::encode_fp16(3 * std::ldexp(1.0, -25)), 0x0002);  // tie -> even
  EXPECT_EQ(mla_test::encode_fp8_e4m3fn(1.0 + 1.0 / 16), 0x38);        // tie -> even
  EXPECT_EQ(mla_test::encode_fp8_e4m3fn(1.0 + 3.0 / 16), 0x3a);        // tie -> even
  EXPECT_EQ(mla_test::encode_fp8_e4m3fn(1.0 / 1024), 0x00);            // half of 2^-9: tie -> 0
  EXPECT_EQ(mla_test::encode_fp8_e4m3fn(15.0 * std::ldexp(1.0, -10)), 0x08);  // rounds to 2^-6
  EXPECT_EQ(mla_test::encode_fp8_e4m3fn(-460.0), 0xfe);
  EXPECT_THROW(mla_test::encode_fp8_e4m3fn(470.0), std::out_of_range);
  EXPECT_THROW(mla_test::encode_fp16(65520.0), std::out_of_range);
}

}  // namespace
