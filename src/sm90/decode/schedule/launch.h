// The balanced schedule of the seesaw kernel (format.h): the plan kernel that writes
// it into the workspace from seq_lens and the query lengths, on the device.
#pragma once

#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::schedule {

// Where the plan kernel writes (the workspace pieces that params' sched_* pointers read).
struct Outputs {
  Request* requests = nullptr;     // [B]
  Token* tokens = nullptr;         // [T] the combine's list
  int32_t* part_first = nullptr;   // [num_parts]
  int32_t* part_blocks = nullptr;  // [1]
};

// One CTA: positions by a block-wide scan of the requests' costs, segments and partial rows by a
// second scan. `max_q_len` and `max_blocks` (ceil(max_seq_len / 64)) bound each request's query
// tokens and blocks: the workspace was sized for them, whatever seq_lens and cum_seq_lens_q hold.
// `fixed_blocks` is the cost put before every request (kFixedBlocks); `uniform_slack` how much
// longer (percent) the uniform split's runs may be than the even share (kUniformSlackPercent);
// `max_rows` the partial rows the workspace holds (a request past them is planned without blocks).
cudaError_t launch_schedule(const DecodeKernelParams& params, const Outputs& out, int max_q_len,
                            int max_blocks, int fixed_blocks, int uniform_slack, int64_t max_rows,
                            cudaStream_t stream, bool pdl);

// One CTA: the tokens of a sparse call by decreasing counted blocks into `order` [T]
// (params.h, sparse_order; sparse_order_kernel.cu).
cudaError_t launch_sparse_order(const DecodeKernelParams& params, int32_t* order,
                                cudaStream_t stream, bool pdl);

}  // namespace mla::sm90::schedule
