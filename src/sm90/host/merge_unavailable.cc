// The sm90 merge and peer exchange entry points of a build without CUDA (MLA_ENABLE_CUDA=OFF).
// Never reached: validation refuses CUDA tensors first (sm90::check_device of
// src/sm90/host/unavailable.cc), but the library links them.
#include "host/backends.h"
#include "host/check.h"

namespace mla::detail::sm90 {

void merge_states(const MergeProblem&, const MergeParams&) {
  MLA_FAIL(ErrorCode::kUnsupported,
           "backend: sm90 is not available in this build (configured with MLA_ENABLE_CUDA=OFF); "
           "merge CUDA tensors in a build with CUDA, or host tensors with backend cpu");
}

}  // namespace mla::detail::sm90

namespace mla::detail::sm90 {

void peer_exchange(const PeerExchangeParams&) {
  MLA_FAIL(ErrorCode::kUnsupported,
           "backend: sm90 is not available in this build (configured with MLA_ENABLE_CUDA=OFF); "
           "the peer exchange needs a build with CUDA");
}

}  // namespace mla::detail::sm90
