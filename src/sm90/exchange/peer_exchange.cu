// Peer exchange kernel (include/mla/exchange.h, docs/context-parallel.md): CTA c of every rank
// moves chunk c of its rank's slot into the same slot of every peer's buffer.
//
// One way, no handshake: the bytes travel with their step number. Per CTA, step e (its own step
// count + 1, kept in the buffer: the same on every rank, since every rank makes the same calls),
// parity h = e & 1:
//   1. push: each 8 bytes of the chunk go to each peer as one 16-byte line {low word, e, high
//      word, e} (one 16-byte store), into the peer's landing area (h, this rank);
//   2. land: the CTA polls its chunk's lines in its own landing area (h, peer) for each peer until
//      both step words of a line read e (a line is stored whole or seen torn, never mixed with
//      another step's line under matching words), and writes their 8 bytes into slot `peer`.
// The kernel ends when every chunk of every peer has landed; kernels after it on the stream (the
// merge) read the slots.
//
// Why two parities are enough: a rank pushes step e into a peer's area h after its own step e - 1
// has ended, which needed the peer's step e - 1 lines, which the peer pushed after its step e - 2
// (the last reader of area h) had ended (stream order: each rank's step starts after its previous
// kernels, the PDL wait first). Lines of step e - 2 still in the area carry another step number.
//
// No CTA waits on anything but lines the peers' same CTA pushes before it waits itself, and the
// grid is at most kMaxCtas CTAs of 256 threads, far below what the device holds at once: every
// CTA of every rank can be resident together.
#include <cstdint>

#include "sm90/common.cuh"
#include "sm90/exchange/launch.h"

namespace mla::sm90::exchange {
namespace {

__device__ __forceinline__ void store_line(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ uint4 load_line(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// The landing area of parity h and rank r in `buffer`, as lines of 16 bytes.
__device__ __forceinline__ uint4* landing(unsigned char* buffer, const PeerExchangeKernelParams& p,
                                          uint32_t h, int r) {
  const int64_t area = 2 * p.slot_bytes;  // lines for one rank's slot
  return reinterpret_cast<uint4*>(buffer + p.num_ranks * p.slot_bytes +
                                  (static_cast<int64_t>(h) * p.num_ranks + r) * area);
}

__global__ void __launch_bounds__(kThreads)
    peer_exchange_kernel(const __grid_constant__ PeerExchangeKernelParams p) {
  pdl_wait();  // this rank's slot comes from the previous kernels (the local decode)
  // The next kernel (the merge) may start its CTAs beside these (at most kMaxCtas, all resident
  // by now): its own wait still waits for this grid to end.
  pdl_launch_dependents();
  const int c = blockIdx.x;
  const int tid = threadIdx.x;
  unsigned char* const mine = p.buffers[p.rank];
  uint32_t* const steps = reinterpret_cast<uint32_t*>(mine + p.steps_at);
  __shared__ uint32_t step;
  if (tid == 0) step = steps[c] + 1;
  __syncthreads();
  const uint32_t e = step;
  const uint32_t h = e & 1u;

  const int64_t begin = c * p.chunk_bytes;
  const int64_t end = begin + p.chunk_bytes < p.slot_bytes ? begin + p.chunk_bytes : p.slot_bytes;
  const int words = static_cast<int>((end - begin) / 8);  // 8-byte words of the chunk
  const int64_t first = begin / 8;                        // its first word (= line) index

  // 1. push.
  const uint2* src = reinterpret_cast<const uint2*>(mine + p.rank * p.slot_bytes) + first;
  for (int i = tid; i < words; i += kThreads) {
    const uint2 w = src[i];
    const uint4 line = make_uint4(w.x, e, w.y, e);
    for (int r = 0; r < p.num_ranks; ++r) {
      if (r != p.rank) store_line(landing(p.buffers[r], p, h, p.rank) + first + i, line);
    }
  }

  // 2. land.
  for (int r = 0; r < p.num_ranks; ++r) {
    if (r == p.rank) continue;
    const uint4* lines = landing(mine, p, h, r) + first;
    uint2* dst = reinterpret_cast<uint2*>(mine + r * p.slot_bytes) + first;
    for (int i = tid; i < words; i += kThreads) {
      uint4 line = load_line(lines + i);
      while (line.y != e || line.w != e) line = load_line(lines + i);
      dst[i] = make_uint2(line.x, line.z);
    }
  }
  __syncthreads();
  if (tid == 0) steps[c] = e;
}

}  // namespace

cudaError_t launch_peer_exchange(const PeerExchangeKernelParams& params, int ctas,
                                 cudaStream_t stream, bool pdl) {
  if (ctas < 1 || ctas > kMaxCtas) return cudaErrorInvalidValue;
  return launch(&peer_exchange_kernel, dim3(static_cast<unsigned>(ctas)), dim3(kThreads), 0, stream,
                pdl, params);
}

}  // namespace mla::sm90::exchange
