// The messages of a bad index entry (src/host/bad_index.h, docs/contract.md section 5), which the
// cpu backend and the sm90 checked mode share: each names the tensor, the entry's coordinates, its
// value and the range it must lie in. The texts are checked here in full for every kind of entry;
// then the cpu backend's index check is run to show that it reports through them, in the checked
// mode's order. No GPU needed.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/decode_case.h"
#include "host/backends.h"
#include "host/bad_index.h"
#include "mla/mla.h"

namespace {

using mla::detail::Problem;
using mla::detail::TopkLensMode;
namespace bad_index = mla::detail::bad_index;
using namespace mla_test::decode_case;  // Case, Built, build, kv_page_tables

// B = 3, q_len 2, 10 pages of 16 keys, block tables of 4 pages.
Problem dense() {
  Problem p;
  p.batch = 3;
  p.q_len = 2;
  p.num_tokens = 6;
  p.max_q_len = 2;
  p.num_pages = 10;
  p.page_size = 16;
  p.max_pages = 4;
  p.max_seq_len = 64;
  return p;
}

// The same batch with ragged queries (T = 5) and a dense mask of one uint32 word per row.
Problem ragged() {
  Problem p = dense();
  p.ragged = true;
  p.q_len = 0;
  p.num_tokens = 5;
  p.has_mask = true;
  p.mask_words = 1;
  return p;
}

// Sparse mode: top-k 16 over the pool of 10 pages of 16 slots, no block tables.
Problem sparse(bool is_ragged, TopkLensMode mode) {
  Problem p = is_ragged ? ragged() : dense();
  p.has_mask = false;
  p.mask_words = 0;
  p.sparse = true;
  p.max_pages = 0;
  p.top_k = 16;
  p.topk_lens_mode = mode;
  return p;
}

TEST(BadIndexMessage, SeqLens) {
  Problem p = dense();
  EXPECT_EQ(bad_index::seq_len(p, 1, -1), "seq_lens[1]: -1 is negative");
  EXPECT_EQ(bad_index::seq_len(p, 2, 70), "seq_lens[2]: 70 exceeds max_seq_len 64");
  p.max_seq_len = 100;
  EXPECT_EQ(bad_index::seq_len(p, 2, 65),
            "seq_lens[2]: 65 exceeds the block_tables capacity 64 (4 pages of 16)");
  p = sparse(false, TopkLensMode::kNone);
  EXPECT_EQ(bad_index::seq_len(p, 0, 65), "seq_lens[0]: 65 exceeds max_seq_len 64");
}

TEST(BadIndexMessage, CumSeqLensQ) {
  Problem p = ragged();
  EXPECT_EQ(bad_index::cum_seq_lens_q_first(1), "cum_seq_lens_q[0]: expected 0, got 1");
  EXPECT_EQ(bad_index::cum_seq_lens_q_request(p, 1, 3, 2),
            "cum_seq_lens_q[2]: 2 is less than cum_seq_lens_q[1] = 3 (must be non-decreasing)");
  EXPECT_EQ(bad_index::cum_seq_lens_q_request(p, 0, 0, 3),
            "cum_seq_lens_q[1]: request 0 has 3 query tokens (3 - 0), more than max_q_len 2");
  p.max_q_len = 40;
  EXPECT_EQ(bad_index::cum_seq_lens_q_request(p, 2, 3, 36),
            "cum_seq_lens_q[3]: request 2 has 33 query tokens (36 - 3), more than the 32 bits of "
            "a mask row (1 uint32 words)");
  EXPECT_EQ(bad_index::cum_seq_lens_q_last(p, 4),
            "cum_seq_lens_q[3]: expected the query token count 5, got 4");
}

TEST(BadIndexMessage, BlockTables) {
  Problem p = dense();
  EXPECT_EQ(bad_index::page(p, 0, 1, 10), "block_tables[0][1]: page id 10 out of range [0, 10)");
  p.kv_page_tables = true;  // [B, 2, max_pages]: row 0 is named with its row
  EXPECT_EQ(bad_index::page(p, 2, 1, -1), "block_tables[2][0][1]: page id -1 out of range [0, 10)");
  EXPECT_EQ(bad_index::kv_page(2, 1, 5, 3),
            "block_tables[2][1][1]: page id 3 differs from block_tables[2][0][1] = 5 (separate "
            "K/V page tables must name the same pages for MLA)");
}

TEST(BadIndexMessage, SparseTopkLens) {
  EXPECT_EQ(bad_index::topk_len(sparse(false, TopkLensMode::kPerRequest), 1, 17),
            "sparse_topk_lens[1]: 17 out of range [0, 16]");
  EXPECT_EQ(bad_index::topk_len(sparse(true, TopkLensMode::kPerRequest), 1, 17),
            "sparse_topk_lens[1]: 17 out of range [0, 16]");
  // Per-token lengths: [b][i] for [B, q_len] ones, [t] for ragged [T] ones.
  EXPECT_EQ(bad_index::topk_len(sparse(false, TopkLensMode::kPerToken), 3, -1),
            "sparse_topk_lens[1][1]: -1 out of range [0, 16]");
  EXPECT_EQ(bad_index::topk_len(sparse(true, TopkLensMode::kPerToken), 3, -1),
            "sparse_topk_lens[3]: -1 out of range [0, 16]");
}

TEST(BadIndexMessage, SparseIndices) {
  EXPECT_EQ(bad_index::sparse_index(sparse(false, TopkLensMode::kNone), 5, 3, 160),
            "sparse_indices[2][1][3]: slot 160 out of range [-1, 160)");
  EXPECT_EQ(bad_index::sparse_index(sparse(true, TopkLensMode::kNone), 4, 0, -2),
            "sparse_indices[4][0]: slot -2 out of range [-1, 160)");
}

TEST(BadIndexMessage, FailThrowsBadIndex) {
  try {
    bad_index::fail("seq_lens[1]: -1 is negative");
    ADD_FAILURE() << "no error";
  } catch (const mla::Error& e) {
    EXPECT_EQ(e.code(), mla::ErrorCode::kBadIndex);
    EXPECT_STREQ(e.what(), "seq_lens[1]: -1 is negative");
  }
}

// ---- The cpu backend reports through these messages ----

// The message of the BadIndex error that decode raises for `b`.
std::string bad_index_of(const Built& b) {
  try {
    mla::decode(b.params);
  } catch (const mla::Error& e) {
    EXPECT_EQ(e.code(), mla::ErrorCode::kBadIndex) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(BadIndexCpu, SeqLenAndPage) {
  std::unique_ptr<Built> b = build(small_index_case());
  b->seq_lens[1] = -1;
  EXPECT_EQ(bad_index_of(*b), bad_index::seq_len(mla::detail::validate(b->params), 1, -1));
  b = build(small_index_case());
  b->block_tables[2 * b->block_table_stride + 1] = -1;  // request 2, its last needed page
  EXPECT_EQ(bad_index_of(*b), bad_index::page(mla::detail::validate(b->params), 2, 1, -1));
}

TEST(BadIndexCpu, SparseIndex) {
  Case c = small_index_case();
  c.top_k = 16;
  std::unique_ptr<Built> b = build(c);
  const int32_t slot = b->num_pages * c.page_size;  // one past the pool
  b->sparse_indices[5 * 16 + 3] = slot;             // token 5: request 2, its token 1
  EXPECT_EQ(bad_index_of(*b),
            bad_index::sparse_index(mla::detail::validate(b->params), 5, 3, slot));
}

// Every request's row 0 is checked before any row 1 (the checked mode's order): a bad page of
// request 2 is reported before row 1 of request 0 differing.
TEST(BadIndexCpu, RowZeroBeforeRowOne) {
  std::unique_ptr<Built> b = build(small_index_case());
  std::vector<int32_t> tables = kv_page_tables(*b, 0);
  const int64_t mp = b->max_pages;
  b->params.block_tables =
      mla::TensorView::contiguous(tables.data(), mla::dtype::kInt32, {b->c.B, 2, mp});
  int32_t& v00 = tables[mp];  // request 0, row 1, page 0 (needed: seq_len 40)
  v00 = tables[0] == 0 ? 1 : 0;
  tables[2 * 2 * mp + 1] = -1;  // request 2, row 0, page 1 (needed: seq_len 20)
  const Problem p = mla::detail::validate(b->params);
  EXPECT_EQ(bad_index_of(*b), bad_index::page(p, 2, 1, -1));
  tables[2 * 2 * mp + 1] = tables[2 * 2 * mp + mp + 1];
  EXPECT_EQ(bad_index_of(*b), bad_index::kv_page(0, 0, tables[0], v00));
}

}  // namespace
