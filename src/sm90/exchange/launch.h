// The peer exchange kernel's ABI and its launch (include/mla/exchange.h); the kernel is in
// peer_exchange.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mla::sm90::exchange {

inline constexpr int kMaxRanks = 8;   // mla::kMaxPeerRanks
inline constexpr int kMaxCtas = 64;   // CTAs of one exchange, at most
inline constexpr int kThreads = 256;  // threads per CTA
// Bytes of a slot a CTA moves at least (fewer CTAs for small slots).
inline constexpr int64_t kMinChunkBytes = 4096;

// A rank's buffer: num_ranks slots of slot_bytes, then the landing area, then the step counters.
// The landing area holds, for each step parity and each rank, that rank's slot as lines of 16
// bytes, each 8 bytes of the slot and the step number twice (landing_bytes = 2 x N x 2 x
// slot_bytes); the counters are one 32-bit word per CTA (kControlBytes).
inline constexpr int64_t kControlBytes = kMaxCtas * 4;
constexpr int64_t landing_bytes(int num_ranks, int64_t slot_bytes) {
  return 4 * num_ranks * slot_bytes;
}

struct PeerExchangeKernelParams {
  unsigned char* buffers[kMaxRanks];  // every rank's buffer, mapped here
  int num_ranks;
  int rank;
  int64_t slot_bytes;   // a multiple of 16
  int64_t chunk_bytes;  // slot bytes per CTA, a multiple of 16
  int64_t steps_at;     // byte offset of the step counters: N x slot_bytes + landing_bytes
};

// CTAs of an exchange of `slot_bytes` and each one's chunk (the last may be shorter). Depends on
// slot_bytes only, so every rank launches the same grid.
inline int exchange_ctas(int64_t slot_bytes, int64_t& chunk_bytes) {
  int64_t ctas = (slot_bytes + kMinChunkBytes - 1) / kMinChunkBytes;
  if (ctas > kMaxCtas) ctas = kMaxCtas;
  if (ctas < 1) ctas = 1;
  chunk_bytes = ((slot_bytes + ctas - 1) / ctas + 15) / 16 * 16;
  return static_cast<int>((slot_bytes + chunk_bytes - 1) / chunk_bytes);
}

cudaError_t launch_peer_exchange(const PeerExchangeKernelParams& params, int ctas,
                                 cudaStream_t stream, bool pdl);

}  // namespace mla::sm90::exchange
