// Moving each rank's partial state to every other rank over peer-to-peer memory: the transport of
// context parallelism's p2p method (docs/context-parallel.md, The exchange). The ranks' buffers
// are mapped into every rank's address space by the caller (the Python package uses PyTorch's
// symmetric memory); the kernel stores each rank's slot into the peers' buffers, each 8 bytes
// with the step's number beside them, so that a rank knows its peers' bytes have landed without
// any other signal or collective library call: one trip over the link per step.
#pragma once

#include <cstdint>

#include "mla/decode.h"
#include "mla/error.h"
#include "mla/tensor.h"

namespace mla {

/// Most ranks one peer exchange takes.
inline constexpr int kMaxPeerRanks = 8;

/// @brief Bytes of one rank's exchange buffer: num_ranks slots of slot_bytes (rank r's data in
/// slot r, at byte r * slot_bytes), then the exchange's landing area (4 x num_ranks x slot_bytes:
/// the peers' bytes as they arrive, for two steps) and step counters (256 bytes): 5 x num_ranks x
/// slot_bytes + 256 in all. Everything after the slots must be zero before the first exchange on
/// the buffer (allocate it zeroed); every later exchange keeps it consistent. Throws mla::Error for
/// num_ranks outside [1, kMaxPeerRanks] or slot_bytes not a positive multiple of 16 (at most
/// 2^36).
int64_t peer_exchange_buffer_bytes(int num_ranks, int64_t slot_bytes);

/// @brief Every argument of one peer exchange, as this rank sees it.
///
/// On entry (in stream order) slot `rank` of this rank's buffer holds this rank's bytes of the
/// step; on exit every slot r of it holds rank r's bytes of the same step. Each of the num_ranks
/// ranks makes the same sequence of exchanges on its own buffer (same num_ranks and slot_bytes,
/// one after another on one stream), each after the step's writes of its slot and before its
/// reads of the others; one buffer serves every step (the landing area alternates between two
/// halves, and a rank's step starts only after its previous one ended, which needed every peer's
/// previous step). The kernel spins until the peers' bytes land (no timeout): a rank that never
/// makes its call hangs the others, as with any collective.
struct PeerExchangeParams {
  TensorView buffer;  // this rank's buffer: uint8 [bytes >= peer_exchange_buffer_bytes], CUDA,
                      // contiguous, 16-byte aligned
  void* peer_buffers[kMaxPeerRanks] = {};  // rank r's buffer as mapped in this process (device
                                           // addresses, 16-byte aligned); [rank] is buffer.data
  int num_ranks = 0;                       // N, 1..kMaxPeerRanks
  int rank = 0;                            // this rank, 0..N-1
  int64_t slot_bytes = 0;                  // bytes of one rank's slot, a positive multiple of 16

  // Execution.
  Backend backend = Backend::kAuto;  // sm90 (the cpu backend has no peers: refused)
  bool enable_pdl = false;  // launch as a programmatic dependent of the previous kernel (sm90)
  void* stream = nullptr;   // cudaStream_t
};

/// @brief Validates every argument (nothing is written on error), then launches the exchange on
/// params.stream: no allocation, no host sync, so it can be captured in a CUDA graph (the flags'
/// step counters live in the buffer, not on the host).
void peer_exchange(const PeerExchangeParams& params);

}  // namespace mla
