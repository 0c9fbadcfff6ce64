// Host-side entry point of the v2 (seesaw) decode kernel; definitions in seesaw_<e>.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::seesaw {

// Computes the partials of every (split, token, head) as v1 did (same grid,
// tiles of 64 query rows, workspace layout and kv_cache tensor map); one explicit instantiation
// per supported element type (query and kv_cache alike). Grid (num_tiles, params.num_parts) over
// the balanced schedule, or, with `direct_split` (a call of one request), (num_tiles,
// params.num_splits) equal runs of the request's blocks in the uniform layout. `pair`: tiles 2k
// and 2k + 1 of a request read the same blocks (their rows are of the same query tokens), so the
// kernel may run them as a cluster of two sharing each block's loads (docs/sm90-v2.md, Pairs); it
// does on the balanced schedule where the device holds the whole grid in such clusters at once.
// `clean`: rows of a tile may attend the request's draft keys unequally (a custom mask, or tiles
// that span two tokens); the kernel then keeps a non-finite draft key from reaching the rows that
// do not attend it (seesaw_kernel.cuh, kClean), and runs unpaired.
template <Elem E>
cudaError_t launch_seesaw(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                          int num_tiles, bool direct_split, bool pair, bool clean,
                          cudaStream_t stream, bool pdl);

// Which kernel the last launch_seesaw on the calling host thread ran (launch_record.cc). The sm90
// tests read it: that the pair policy and the device's cluster capacity put a call where its
// shape says it goes is otherwise invisible in the results.
struct SeesawLaunch {
  bool direct_split = false;
  bool paired = false;
};
SeesawLaunch last_seesaw_launch();
void note_seesaw_launch(SeesawLaunch launch);

}  // namespace mla::sm90::seesaw
