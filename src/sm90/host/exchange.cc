// sm90 backend, host side of peer_exchange: the kernel's parameters and its launch on the caller's
// stream (no allocation, no sync: graph-safe).
#include <cuda_runtime_api.h>

#include "host/backends.h"
#include "host/check.h"
#include "sm90/exchange/launch.h"
#include "sm90/host/device.h"

namespace mla::detail::sm90 {

namespace exchange = ::mla::sm90::exchange;
static_assert(exchange::kControlBytes == kPeerExchangeControlBytes,
              "the step counters of the kernel and of peer_exchange_buffer_bytes differ");
static_assert(exchange::landing_bytes(1, 16) == kPeerExchangeLandingSlots * 16,
              "the landing area of the kernel and of peer_exchange_buffer_bytes differ");
static_assert(exchange::kMaxRanks == kMaxPeerRanks, "the rank limit of the kernel and the API");

void peer_exchange(const PeerExchangeParams& prm) {
  DeviceGuard guard(prm.buffer.device.device_id);
  exchange::PeerExchangeKernelParams k{};
  for (int r = 0; r < prm.num_ranks; ++r) {
    k.buffers[r] = static_cast<unsigned char*>(prm.peer_buffers[r]);
  }
  k.num_ranks = prm.num_ranks;
  k.rank = prm.rank;
  k.slot_bytes = prm.slot_bytes;
  k.steps_at =
      prm.num_ranks * prm.slot_bytes + exchange::landing_bytes(prm.num_ranks, prm.slot_bytes);
  const int ctas = exchange::exchange_ctas(prm.slot_bytes, k.chunk_bytes);
  MLA_CUDA_CHECK(exchange::launch_peer_exchange(k, ctas, static_cast<cudaStream_t>(prm.stream),
                                                prm.enable_pdl),
                 "launching the peer exchange kernel");
}

}  // namespace mla::detail::sm90
