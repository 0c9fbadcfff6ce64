# The sm90 (Hopper) backend: host dispatch and the device kernels, or stubs that reject it when
# the build has no CUDA. Included right after the mla_decode target is declared.

# Limits of the backend, checked on the host in every build.
target_sources(mla_decode PRIVATE src/sm90/host/support.cc)

if(MLA_ENABLE_CUDA)
  target_sources(mla_decode PRIVATE
    # Host side: entry points and launches, the routing step, device facts, environment switches.
    src/sm90/host/sm90.cc
    src/sm90/host/route.cc
    src/sm90/host/device.cc
    src/sm90/host/switches.cc
    # The checked mode's index check.
    src/sm90/check/index_check_kernel.cu
    # Device code by role (docs/architecture.md). Each kernel folder has one file per supported
    # element type (set), compiled in parallel.
    # tma/: what the TMA kernels share (tensor map, K-block ring, ptx helpers, cursors).
    src/sm90/decode/tma/tensor_map.cc
    # simt/: the SIMT kernel, every call the TMA kernels do not take (one file per (query,
    # kv_cache) pair).
    src/sm90/decode/simt/simt_bf16_bf16.cu
    src/sm90/decode/simt/simt_fp16_fp16.cu
    src/sm90/decode/simt/simt_fp8_fp8.cu
    src/sm90/decode/simt/simt_bf16_fp8.cu
    src/sm90/decode/simt/simt_bf16_ds_mla.cu
    # few_rows/: the TMA + wgmma kernel for at most 32 query rows per request (one file per
    # (query, kv_cache) pair and padded row count).
    src/sm90/decode/few_rows/few_rows_bf16_r16.cu
    src/sm90/decode/few_rows/few_rows_bf16_r32.cu
    src/sm90/decode/few_rows/few_rows_fp16_r16.cu
    src/sm90/decode/few_rows/few_rows_fp16_r32.cu
    src/sm90/decode/few_rows/few_rows_bf16_fp8_r16.cu
    src/sm90/decode/few_rows/few_rows_bf16_fp8_r32.cu
    src/sm90/decode/few_rows/few_rows_fp8_fp8_r16.cu
    src/sm90/decode/few_rows/few_rows_fp8_fp8_r32.cu
    src/sm90/decode/few_rows/few_rows_bf16_ds_mla_r16.cu
    src/sm90/decode/few_rows/few_rows_bf16_ds_mla_r32.cu
    # ... and its sparse instantiations (one file per (query, kv_cache) pair, both row counts).
    src/sm90/decode/few_rows/few_rows_sparse_bf16.cu
    src/sm90/decode/few_rows/few_rows_sparse_fp16.cu
    src/sm90/decode/few_rows/few_rows_sparse_bf16_fp8.cu
    src/sm90/decode/few_rows/few_rows_sparse_fp8_fp8.cu
    src/sm90/decode/few_rows/few_rows_sparse_bf16_ds_mla.cu
    # seesaw/: the TMA + wgmma seesaw kernel (one file per (query, kv_cache) pair).
    src/sm90/decode/seesaw/seesaw_bf16.cu
    src/sm90/decode/seesaw/seesaw_fp16.cu
    src/sm90/decode/seesaw/seesaw_bf16_fp8.cu
    src/sm90/decode/seesaw/seesaw_fp8_fp8.cu
    src/sm90/decode/seesaw/seesaw_bf16_ds_mla.cu
    # ... its variant on the FP8 tensor cores (an e4m3 query over an e4m3 cache) ...
    src/sm90/decode/seesaw/seesaw_fp8_kernel.cu
    src/sm90/decode/seesaw/seesaw_fp8_three.cu
    # ... and its sparse instantiations (one file per (query, kv_cache) pair).
    src/sm90/decode/seesaw/seesaw_sparse_bf16.cu
    src/sm90/decode/seesaw/seesaw_sparse_fp16.cu
    src/sm90/decode/seesaw/seesaw_sparse_bf16_fp8.cu
    src/sm90/decode/seesaw/seesaw_sparse_fp8_fp8.cu
    src/sm90/decode/seesaw/seesaw_sparse_bf16_ds_mla.cu
    # schedule/: the plan kernel of the seesaw kernel's balanced schedule.
    src/sm90/decode/schedule/schedule_kernel.cu
    src/sm90/decode/schedule/sparse_order_kernel.cu
    # combine/: merges the split partials into out and lse (one file per out dtype).
    src/sm90/decode/combine/combine_bf16.cu
    src/sm90/decode/combine/combine_fp16.cu
  )
  target_link_libraries(mla_decode PRIVATE mla_cutlass)
  set_target_properties(mla_decode PROPERTIES CUDA_RUNTIME_LIBRARY Static)
  target_link_libraries(mla_decode PUBLIC CUDA::cudart_static)
  # ptxas reports registers, shared memory and spills of every kernel; MLA_PTXAS_VERBOSE=OFF
  # silences it.
  option(MLA_PTXAS_VERBOSE "Print ptxas resource usage of the device kernels" ON)
  target_compile_options(mla_decode PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo -Xcompiler=-Wall,-Wextra>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${MLA_PTXAS_VERBOSE}>>:-Xptxas=-v,-warn-spills,-warn-lmem-usage>)
else()
  target_sources(mla_decode PRIVATE src/sm90/host/unavailable.cc)
endif()

# The merge of partial (out, lse) states (include/mla/merge.h): the sm90 host side and the kernel
# (merge/, one file per out dtype) with CUDA, a stub without.
if(MLA_ENABLE_CUDA)
  target_sources(mla_decode PRIVATE
    src/sm90/host/merge.cc
    src/sm90/decode/merge/merge_bf16.cu
    src/sm90/decode/merge/merge_fp16.cu
    # The peer exchange of context parallelism's p2p method (include/mla/exchange.h).
    src/sm90/host/exchange.cc
    src/sm90/exchange/peer_exchange.cu
  )
else()
  target_sources(mla_decode PRIVATE src/sm90/host/merge_unavailable.cc)
endif()
