// The messages of mla::Error (BadIndex): one bad entry of an index tensor (docs/contract.md
// section 5), named with its coordinates, its value and the range it must lie in. Both backends
// report through these functions, the cpu backend's index check and the sm90 checked mode (which
// finds the entry on the device and reads it back), so that the same bad input gives the same
// message on either.
//
// Each function takes the entry's coordinates and value (and, where the rule compares two
// entries, the other one) of an entry that breaks a rule, and returns the message; where an entry
// can break several rules, it names the first in the order below. The checks visit the entries in
// one order on both backends: seq_lens, cum_seq_lens_q, block_tables row 0, sparse_topk_lens,
// sparse_indices, then row 1 of [B, 2, max_pages] block tables.
#pragma once

#include <cstdint>
#include <string>

#include "host/problem.h"

namespace mla::detail::bad_index {

// seq_lens[b] = len: negative, above max_seq_len, or (block_tables mode) above the block tables'
// capacity of max_pages pages.
std::string seq_len(const Problem& p, int64_t b, int64_t len);

// cum_seq_lens_q[0] = first, which must be 0.
std::string cum_seq_lens_q_first(int64_t first);

// cum_seq_lens_q[b + 1] = hi after cum_seq_lens_q[b] = lo: request b's hi - lo query tokens are
// negative (a decreasing entry), more than max_q_len, or (dense mask) more than a mask row's bits.
std::string cum_seq_lens_q_request(const Problem& p, int64_t b, int64_t lo, int64_t hi);

// cum_seq_lens_q[B] = last, which must be the query token count T.
std::string cum_seq_lens_q_last(const Problem& p, int64_t last);

// block_tables[b][k] (row 0 of [B, 2, max_pages] tables: block_tables[b][0][k]) = id, outside
// [0, num_pages).
std::string page(const Problem& p, int64_t b, int64_t k, int64_t id);

// block_tables[b][1][k] = id1 differs from block_tables[b][0][k] = id0 ([B, 2, max_pages] tables).
std::string kv_page(int64_t b, int64_t k, int64_t id0, int64_t id1);

// sparse_topk_lens entry `index` (request b for [B] lengths, the global query token for per-token
// ones) = len, outside [0, top_k].
std::string topk_len(const Problem& p, int64_t index, int64_t len);

// Entry k of global query token `token`'s sparse_indices row = slot, outside [-1, P * page_size).
std::string sparse_index(const Problem& p, int64_t token, int64_t k, int64_t slot);

// Throws mla::Error (BadIndex) with `message`.
[[noreturn]] void fail(const std::string& message);

}  // namespace mla::detail::bad_index
