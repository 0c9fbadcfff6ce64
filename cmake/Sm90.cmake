# The sm90 (Hopper) backend: host dispatch and the device kernels, or stubs that reject it when
# the build has no CUDA. Included right after the mla_decode target is declared.

# Limits of the backend, checked on the host in every build.
target_sources(mla_decode PRIVATE src/sm90/host/support.cc)

if(MLA_ENABLE_CUDA)
  target_sources(mla_decode PRIVATE
    src/sm90/host/sm90.cc
    src/sm90/check/index_check_kernel.cu
    # One file per (query, kv_cache) pair and per out dtype: the supported set, compiled in parallel.
    src/sm90/decode/v0/split_kv_bf16_bf16.cu
    src/sm90/decode/v0/split_kv_fp16_fp16.cu
    src/sm90/decode/v0/split_kv_fp8_fp8.cu
    src/sm90/decode/v0/split_kv_bf16_fp8.cu
    src/sm90/decode/v0/split_kv_bf16_ds_mla.cu
    src/sm90/decode/v0/combine_bf16.cu
    src/sm90/decode/v0/combine_fp16.cu
    # v1/: what the TMA kernels share (tensor map, K pipeline, ptx helpers, tile rows).
    src/sm90/decode/v1/tensor_map.cc
    # v2: TMA + wgmma seesaw kernel for 16-bit query/kv_cache (one file per element type).
    src/sm90/decode/v2/seesaw_bf16.cu
    src/sm90/decode/v2/seesaw_fp16.cu
    src/sm90/decode/v2/schedule.cu
    src/sm90/decode/v2/launch_record.cc
    # rows: the transposed kernel for at most 32 query rows per request (one file per dtype and N).
    src/sm90/decode/rows/few_rows_bf16_r16.cu
    src/sm90/decode/rows/few_rows_bf16_r32.cu
    src/sm90/decode/rows/few_rows_fp16_r16.cu
    src/sm90/decode/rows/few_rows_fp16_r32.cu
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
