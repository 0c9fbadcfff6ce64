// The messages of mla::Error (BadIndex), shared by the cpu backend and the sm90 checked mode.
#include "host/bad_index.h"

#include "mla/error.h"

namespace mla::detail::bad_index {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// "name[b][i]" for [B, q_len, ...] tensors, "name[t]" for ragged [T, ...] ones; `token` is the
// global query token (b * q_len + i when dense).
std::string token_entry(const char* name, const Problem& p, int64_t token) {
  if (p.ragged || p.q_len <= 0) return std::string(name) + "[" + str(token) + "]";
  return std::string(name) + "[" + str(token / p.q_len) + "][" + str(token % p.q_len) + "]";
}

}  // namespace

std::string seq_len(const Problem& p, int64_t b, int64_t len) {
  const std::string entry = "seq_lens[" + str(b) + "]: " + str(len);
  if (len < 0) return entry + " is negative";
  if (p.sparse || len > p.max_seq_len) return entry + " exceeds max_seq_len " + str(p.max_seq_len);
  return entry + " exceeds the block_tables capacity " + str(p.max_pages * p.page_size) + " (" +
         str(p.max_pages) + " pages of " + str(p.page_size) + ")";
}

std::string cum_seq_lens_q_first(int64_t first) {
  return "cum_seq_lens_q[0]: expected 0, got " + str(first);
}

std::string cum_seq_lens_q_request(const Problem& p, int64_t b, int64_t lo, int64_t hi) {
  const std::string entry = "cum_seq_lens_q[" + str(b + 1) + "]: ";
  const int64_t n = hi - lo;
  if (n < 0) {
    return entry + str(hi) + " is less than cum_seq_lens_q[" + str(b) + "] = " + str(lo) +
           " (must be non-decreasing)";
  }
  const std::string tokens =
      "request " + str(b) + " has " + str(n) + " query tokens (" + str(hi) + " - " + str(lo) + ")";
  if (n > p.max_q_len) return entry + tokens + ", more than max_q_len " + str(p.max_q_len);
  return entry + tokens + ", more than the " + str(p.mask_words * 32) + " bits of a mask row (" +
         str(p.mask_words) + " uint32 words)";
}

std::string cum_seq_lens_q_last(const Problem& p, int64_t last) {
  return "cum_seq_lens_q[" + str(p.batch) + "]: expected the query token count " +
         str(p.num_tokens) + ", got " + str(last);
}

std::string page(const Problem& p, int64_t b, int64_t k, int64_t id) {
  return "block_tables[" + str(b) + (p.kv_page_tables ? "][0][" : "][") + str(k) + "]: page id " +
         str(id) + " out of range [0, " + str(p.num_pages) + ")";
}

std::string kv_page(int64_t b, int64_t k, int64_t id0, int64_t id1) {
  return "block_tables[" + str(b) + "][1][" + str(k) + "]: page id " + str(id1) +
         " differs from block_tables[" + str(b) + "][0][" + str(k) + "] = " + str(id0) +
         " (separate K/V page tables must name the same pages for MLA)";
}

std::string topk_len(const Problem& p, int64_t index, int64_t len) {
  const std::string entry = p.topk_lens_mode == TopkLensMode::kPerToken
                                ? token_entry("sparse_topk_lens", p, index)
                                : "sparse_topk_lens[" + str(index) + "]";
  return entry + ": " + str(len) + " out of range [0, " + str(p.top_k) + "]";
}

std::string sparse_index(const Problem& p, int64_t token, int64_t k, int64_t slot) {
  return token_entry("sparse_indices", p, token) + "[" + str(k) + "]: slot " + str(slot) +
         " out of range [-1, " + str(p.num_pages * p.page_size) + ")";
}

void fail(const std::string& message) { throw Error(ErrorCode::kBadIndex, message); }

}  // namespace mla::detail::bad_index
