"""FlashInfer-compatible entry point: ``trtllm_batch_decode_with_kv_cache_mla``.

Same parameter names, positional order and defaults as ``flashinfer.mla.
trtllm_batch_decode_with_kv_cache_mla``, and FlashInfer's meaning for each of them, so an engine
can switch by changing the import. What FlashInfer defines and this library cannot do raises an
error naming the argument and value: FlashInfer's Blackwell backend names, the fp16 softmax
variant. Arguments that only pick among FlashInfer's kernels are
accepted and have no effect here. Where FlashInfer's own backends disagree (the base of ``lse``),
the docstring says which answer this function gives.
"""

from __future__ import annotations

import numbers
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _arrays
from ._api import Scale, Tensor, _int, batch_decode, check_backend

# Accepted values of FlashInfer's kernel-selection strings.
CUTE_DSL_IMPLS = ("auto", "modular", "monolithic")
KV_SCALE_FORMATS = ("auto", "pow2_fp32", "arbitrary_fp32")

# Bytes per token of the fp8_ds_mla cache (DeepSeek-V3.2's packed FP8 format).
DS_MLA_ROW_BYTES = 656


def _single_sinks(sinks: Union[None, Tensor, Sequence[Tensor]]) -> Optional[Tensor]:
    """FlashInfer types sinks as Optional[List[Tensor]]; every backend takes one [H] tensor (or a
    list holding one)."""
    if sinks is None or _arrays.is_tensor(sinks):
        return sinks
    if isinstance(sinks, (list, tuple)):
        if len(sinks) != 1:
            raise ValueError(
                f"sinks: expected one [H] tensor (or a list holding one), got a list of "
                f"{len(sinks)}"
            )
        return sinks[0]
    raise TypeError(
        f"sinks: expected an [H] float32, bfloat16 or float16 tensor, got {type(sinks).__name__}"
    )


def _choice(name: str, value: Any, choices: Tuple[str, ...], normalize: bool = False) -> str:
    text = value
    if normalize and isinstance(value, str):
        text = value.lower().replace("-", "_")  # FlashInfer's normalization of kv_scale_format
    if not isinstance(text, str) or text not in choices:
        raise ValueError(
            f"{name}: expected one of {', '.join(repr(c) for c in choices)}, got {value!r}"
        )
    return text


def _optional_bool(name: str, value: Any) -> Optional[bool]:
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"{name}: expected a bool or None, got {type(value).__name__}")


def _check_context_parallel(
    enable_dcp: Any, cp_world: Any, cp_rank: Any, causal_seqlens_kv_global: Any
) -> None:
    """FlashInfer's rules for its decode-context-parallel arguments (the types; the rest where
    enable_dcp=True, in _dcp_local_args)."""
    if not isinstance(enable_dcp, bool):
        raise TypeError(f"enable_dcp: expected a bool, got {type(enable_dcp).__name__}")
    if isinstance(cp_world, bool) or not isinstance(cp_world, numbers.Integral) or cp_world <= 0:
        raise ValueError(f"cp_world: expected a positive int, got {cp_world!r}")
    if isinstance(cp_rank, bool) or not isinstance(cp_rank, numbers.Integral):
        raise TypeError(f"cp_rank: expected an int, got {type(cp_rank).__name__}")
    if enable_dcp:
        return
    given = [f"cp_world={cp_world}"] if cp_world != 1 else []
    given += [f"cp_rank={cp_rank}"] if cp_rank != 0 else []
    given += ["causal_seqlens_kv_global"] if causal_seqlens_kv_global is not None else []
    if given:
        raise ValueError(
            f"{given[0].split('=')[0]}: context-parallel arguments need enable_dcp=True, got "
            f"{', '.join(given)} with enable_dcp=False"
        )


def _dcp_local_args(
    query: Tensor,
    seq_lens: Any,
    cp_world: int,
    cp_rank: int,
    causal_seqlens_kv_global: Any,
    return_lse: bool,
    sparse: bool,
    cum_seq_lens_q: Any,
    sinks: Any,
) -> Tuple[Tensor, Optional[Tensor]]:
    """enable_dcp=True: FlashInfer's checks, then this rank's local seq_lens and custom mask
    (mla_decode.distributed.local_shard_args; docs/context-parallel.md)."""
    from .distributed import local_shard_args

    if not 0 <= cp_rank < cp_world:
        raise ValueError(
            f"cp_rank: expected 0 <= cp_rank < cp_world, got cp_rank={cp_rank}, "
            f"cp_world={cp_world}"
        )
    if not return_lse:
        raise ValueError(
            "return_lse: enable_dcp=True returns this rank's partial state, which merges by its "
            "lse: pass return_lse=True (as FlashInfer requires)"
        )
    if cum_seq_lens_q is not None:
        raise ValueError("cum_seq_lens_q: enable_dcp=True takes a dense query, as in FlashInfer")
    if sparse:
        raise ValueError("sparse_mla_top_k: enable_dcp=True applies to dense MLA only")
    if sinks is not None:
        raise ValueError(
            "sinks: with enable_dcp=True the sink applies once, after the ranks' states are "
            "merged; pass them to mla_decode.merge_states (or mla_decode.distributed)"
        )
    if causal_seqlens_kv_global is None:
        raise ValueError("causal_seqlens_kv_global: required when enable_dcp=True")
    if not _arrays.is_tensor(causal_seqlens_kv_global):
        raise TypeError(
            f"causal_seqlens_kv_global: expected an int32 [B] tensor, got "
            f"{type(causal_seqlens_kv_global).__name__}"
        )
    _check_int32("causal_seqlens_kv_global", causal_seqlens_kv_global)
    q_shape = _arrays.shape(query)
    if len(q_shape) != 4:
        raise ValueError(
            f"query: enable_dcp=True takes a dense [B, q_len, H, D] query, got shape "
            f"{list(q_shape)}"
        )
    if _arrays.shape(causal_seqlens_kv_global) != (q_shape[0],):
        raise ValueError(
            f"causal_seqlens_kv_global: expected shape [{q_shape[0]}] (one global length per "
            f"request), got {list(_arrays.shape(causal_seqlens_kv_global))}"
        )
    if _arrays.device(causal_seqlens_kv_global) != _arrays.device(query):
        raise ValueError("causal_seqlens_kv_global: expected the query's device")
    if not _arrays.is_tensor(seq_lens):
        raise TypeError(f"seq_lens: expected an int32 [B] tensor, got {type(seq_lens).__name__}")
    _check_int32("seq_lens", seq_lens)
    return local_shard_args(
        seq_lens, causal_seqlens_kv_global, q_shape[1], int(cp_world), int(cp_rank)
    )


def _check_page_table_layout(block_tables: Any, shared: bool) -> None:
    """uses_shared_paged_kv_idx picks the page table's rank, as in FlashInfer."""
    if not _arrays.is_tensor(block_tables):
        return  # validation names what is wrong
    shape = _arrays.shape(block_tables)
    if shared and len(shape) != 2:
        raise ValueError(
            f"block_tables: expected [B, max_pages] with uses_shared_paged_kv_idx=True, got shape "
            f"{list(shape)} (a [B, 2, max_pages] table needs uses_shared_paged_kv_idx=False)"
        )
    if not shared and (len(shape) != 3 or shape[1] != 2):
        raise ValueError(
            f"block_tables: expected [B, 2, max_pages] (separate K and V page tables) with "
            f"uses_shared_paged_kv_idx=False, got shape {list(shape)}"
        )


def _check_int32(name: str, x: Tensor) -> None:
    if _arrays.dtype_name(x) != "int32":
        raise TypeError(f"{name}: expected dtype int32, got {_arrays.dtype_name(x)}")


def _query_tokens(query: Tensor) -> int:
    shape = _arrays.shape(query)
    return shape[0] * shape[1] if len(shape) == 4 else shape[0]


def _per_token_lens(lens: Tensor, query: Tensor) -> Tensor:
    """FlashInfer's sparse_mla_top_k_lens is flat, one entry per query token: [B * q_len] for a
    dense query (viewed here as [B, q_len]), [T] for a ragged one."""
    if not _arrays.is_tensor(lens):
        return lens  # validation names it
    _check_int32("sparse_mla_top_k_lens", lens)
    shape, q_shape = _arrays.shape(lens), _arrays.shape(query)
    tokens = _query_tokens(query)
    if shape != (tokens,):
        raise ValueError(
            f"sparse_mla_top_k_lens: expected [{tokens}] int32 (one entry per query token, "
            f"flattened), got shape {list(shape)}"
        )
    if len(q_shape) == 4 and q_shape[1] != 1:
        return _arrays.reshaped(lens, q_shape[:2], "sparse_mla_top_k_lens", view=False)
    return lens  # [B] with q_len 1, or [T]: one entry per token already


def _packed_topk_lens(seq_lens: Optional[Tensor], query: Tensor) -> Optional[Tensor]:
    """FlashInfer's sparse path over the packed cache takes the top-k lengths in seq_lens: None
    (every entry counts), [B, q_len] or [B * q_len] per token; [B] with q_len > 1 is ignored."""
    if seq_lens is None:
        return None
    if not _arrays.is_tensor(seq_lens):
        raise TypeError(
            f"seq_lens: expected a DLPack tensor or None, got {type(seq_lens).__name__}"
        )
    _check_int32("seq_lens", seq_lens)
    b, q_len = _arrays.shape(query)[:2]
    shape = _arrays.shape(seq_lens)
    if shape == (b, q_len):
        return seq_lens
    if shape == (b * q_len,):
        return seq_lens if q_len == 1 else _arrays.reshaped(seq_lens, (b, q_len), "seq_lens",
                                                            view=False)
    if shape == (b,):
        return None
    raise ValueError(
        f"seq_lens: with the packed fp8_ds_mla kv_cache (sparse_mla_top_k > 0) seq_lens holds the "
        f"top-k lengths: expected None, [{b}], [{b * q_len}] or [{b}, {q_len}] int32, got shape "
        f"{list(shape)}"
    )


def _lse_as_ours(lse: Optional[Tensor], query: Tensor) -> Optional[Tensor]:
    """FlashInfer's lse for a dense [B, q_len, H, D] query is [B * q_len, H]; ours [B, q_len, H]."""
    if lse is None or not _arrays.is_tensor(lse) or not _arrays.is_tensor(query):
        return lse
    q_shape = _arrays.shape(query)
    if len(q_shape) != 4 or len(_arrays.shape(lse)) != 2:
        return lse
    b, q_len, h = q_shape[:3]
    if _arrays.shape(lse) != (b * q_len, h):
        return lse  # validation names the expected shape
    return _arrays.reshaped(lse, (b, q_len, h), "lse", view=True)


def trtllm_batch_decode_with_kv_cache_mla(
    query: Tensor,
    kv_cache: Tensor,
    workspace_buffer: Tensor,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: Tensor,
    seq_lens: Optional[Tensor],
    max_seq_len: int,
    sparse_mla_top_k: int = 0,
    out: Optional[Tensor] = None,
    bmm1_scale: Scale = 1.0,
    bmm2_scale: Scale = 1.0,
    sinks: Optional[List[Tensor]] = None,
    skip_softmax_threshold_scale_factor: Optional[float] = None,
    enable_pdl: Optional[bool] = None,
    backend: str = "auto",
    is_var_seq: bool = True,
    uses_shared_paged_kv_idx: bool = True,
    lse: Optional[Tensor] = None,
    return_lse: bool = False,
    cute_dsl_impl: str = "auto",
    kv_scale_format: str = "auto",
    cum_seq_lens_q: Optional[Tensor] = None,
    max_q_len: Optional[int] = None,
    multi_ctas_kv_counter_buffer: Optional[Tensor] = None,
    sparse_mla_top_k_lens: Optional[Tensor] = None,
    enable_dcp: bool = False,
    cp_world: int = 1,
    cp_rank: int = 0,
    causal_seqlens_kv_global: Optional[Tensor] = None,
    use_fp16_softmax: Optional[bool] = None,
    *,
    stream: Any = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """MLA decode with the signature and semantics of FlashInfer's
    ``flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla``.

    Shapes: B requests, q_len query tokens each (T in all for ragged queries), H heads,
    L = kv_lora_rank, R = qk_rope_head_dim, D = L + R, P pages.

    Args:
        query: ``[B, q_len, H, D]`` (or ``[T, H, D]`` with ``cum_seq_lens_q``),
            ``[q_nope_absorbed | q_pe]``; bfloat16, float16 or float8_e4m3fn.
        kv_cache: ``[P, page_size, D]`` or ``[P, 1, page_size, D]`` in a dtype paired with the
            query's; or the packed fp8_ds_mla cache (uint8 ``[P, page_size, 656]`` or
            ``[P, 1, page_size, 656]``, bfloat16 query, L 512, R 64), which FlashInfer reads on
            its sparse path only: it needs ``sparse_mla_top_k > 0`` and changes what
            ``block_tables`` and ``seq_lens`` hold (see there).
        workspace_buffer: the caller's scratch buffer, any dtype, contiguous; at least
            ``mla_decode.workspace_size(...)`` bytes (FlashInfer's usual 128 MiB is ample); it
            need not be zeroed.
        qk_nope_head_dim: informational, must be positive.
        kv_lora_rank, qk_rope_head_dim: L and R.
        block_tables: dense mode: ``[B, max_pages]`` int32 page table, or ``[B, 2, max_pages]``
            with ``uses_shared_paged_kv_idx=False``. Sparse mode (``sparse_mla_top_k > 0``): the
            sparse indices, ``[B, q_len, top_k]`` (``[T, top_k]`` when ragged) int32 flat KV slots
            ``page * page_size + offset``, -1 for none.
        seq_lens: ``[B]`` int32 KV tokens per request, including the query tokens. With the
            packed fp8_ds_mla cache, FlashInfer's sparse-path meaning instead: the top-k lengths,
            None (every entry counts), ``[B, q_len]`` or ``[B * q_len]`` per query token (a
            ``[B]`` tensor is ignored when q_len > 1), with no causal limit on the entries.
        max_seq_len: host upper bound of seq_lens (at most the block tables' capacity); ignored
            with the packed cache.
        sparse_mla_top_k: top_k of sparse MLA (DeepSeek-V3.2); 0 for dense.
        out: ``query.shape[:-1] + (L,)``, bfloat16 (float16 also accepted). Default: allocated
            as bfloat16 for every query dtype, as FlashInfer does (CuPy has no bfloat16: float16).
        bmm1_scale, bmm2_scale: float or 1-element float32 tensor, natural-log scale (no log2e:
            FlashInfer multiplies a tensor bmm1_scale by log2e internally for trtllm-gen).
        sinks: one ``[H]`` float32, bfloat16 or float16 tensor of per-head sink logits, or a
            list holding one; passed as given.
        skip_softmax_threshold_scale_factor: enables skip-softmax when given.
        enable_pdl: None: on for CUDA tensors (Hopper supports PDL), off on the host.
        backend: "auto", "sm90" or "cpu". FlashInfer's "trtllm-gen", "cute-dsl" (sm100) and
            "xqa", "sparse" (sm120) raise ValueError.
        is_var_seq: accepted, no effect (every call takes per-request lengths).
        uses_shared_paged_kv_idx: True: ``block_tables`` is ``[B, max_pages]``; False:
            TensorRT-LLM's ``[B, 2, max_pages]``, K page table in row 0 and V in row 1, which for
            MLA's shared latent rows must be equal (the checked mode and the cpu backend verify
            it). Dense mode only: False with ``sparse_mla_top_k > 0`` raises ValueError.
        lse: written only with ``return_lse=True``, as FlashInfer: ``[B * q_len, H]`` or
            ``[B, q_len, H]`` (``[T, H]`` when ragged) float32, returned as given.
        return_lse: return ``(out, lse)``; an allocated lse is ``[B * q_len, H]`` (``[T, H]``).
            lse is the natural-log log-sum-exp of the scaled scores, sinks excluded
            (docs/contract.md, section 1.1), -inf for a query without keys. FlashInfer's backends
            disagree here: trtllm-gen and the sm120 sparse backend return base-2 values
            (``lse / ln 2``; the sparse one with the sink in the sum), cute-dsl natural-log ones,
            and its "auto" may pick either.
        cute_dsl_impl: "auto", "modular" or "monolithic"; picks among FlashInfer's cute-dsl
            kernels, no effect here. Other values raise ValueError.
        kv_scale_format: "auto", "pow2_fp32" or "arbitrary_fp32": how FlashInfer's sm120 sparse
            kernel treats the fp8_ds_mla cache's float32 scales (powers of two, DeepSeek-V3.2; or
            any value, GLM). Every scale is multiplied in here, so each value gives the exact
            product for the scales it allows. Other values raise ValueError.
        cum_seq_lens_q, max_q_len: ragged queries (query ``[T, H, D]``); ``max_q_len`` without
            ``cum_seq_lens_q`` raises ValueError, as in FlashInfer.
        multi_ctas_kv_counter_buffer: trtllm-gen's split-KV counters; accepted, unused (the
            split-KV reduction here lives in the workspace).
        sparse_mla_top_k_lens: sparse mode, ``[B * q_len]`` (``[T]`` when ragged) int32, the
            leading entries of each token's indices that count.
        enable_dcp, cp_world, cp_rank, causal_seqlens_kv_global: decode context parallelism,
            with FlashInfer's meaning (its cute-dsl MLA decode): ``kv_cache``, ``block_tables``
            and ``seq_lens`` are this rank's shard, local key k holding global token
            ``k * cp_world + cp_rank``; ``causal_seqlens_kv_global`` (``[B]`` int32) the global
            lengths, query tokens included, which bound each query token's keys causally. Needs
            ``return_lse=True`` and a dense query; returns the rank's partial ``(out, lse)``, to
            merge with :func:`mla_decode.merge_states` (which applies sinks: ``sinks`` with
            ``enable_dcp`` raise ValueError). The other three need enable_dcp, as in FlashInfer.
            docs/context-parallel.md.
        use_fp16_softmax: None or False; True (FlashInfer's SM107-only fp16 softmax, which
            changes results) raises ValueError.
        stream: keyword-only, explicit CUDA stream (default: the caller's current stream).

    Returns:
        ``out``, or ``(out, lse)`` with ``return_lse``.

    Beyond FlashInfer (accepted here, refused by FlashInfer's kernels): the head dims of the
    backend (cpu: any L > 0 and R >= 0; FlashInfer takes (512, 0) only in sparse mode with
    ``sparse_mla_top_k_lens``), float16 ``out``, ``sparse_mla_top_k_lens`` with any head dims,
    scale tensors and ``bmm2_scale`` other than 1 with the packed cache, and skip-softmax in
    sparse mode.
    """
    check_backend(backend)
    _check_context_parallel(enable_dcp, cp_world, cp_rank, causal_seqlens_kv_global)
    if _optional_bool("use_fp16_softmax", use_fp16_softmax):
        raise ValueError(
            "use_fp16_softmax: True selects FlashInfer's fp16-accumulation softmax (trtllm-gen, "
            "SM107 only), which this library does not implement; pass None or False"
        )
    _choice("cute_dsl_impl", cute_dsl_impl, CUTE_DSL_IMPLS)
    _choice("kv_scale_format", kv_scale_format, KV_SCALE_FORMATS, normalize=True)
    if multi_ctas_kv_counter_buffer is not None and not _arrays.is_tensor(
        multi_ctas_kv_counter_buffer
    ):
        raise TypeError(
            f"multi_ctas_kv_counter_buffer: expected a tensor or None, got "
            f"{type(multi_ctas_kv_counter_buffer).__name__}"
        )
    del is_var_seq, multi_ctas_kv_counter_buffer  # no effect here
    if max_q_len is not None and cum_seq_lens_q is None:
        raise ValueError(
            f"max_q_len: only with cum_seq_lens_q (ragged queries), got max_q_len={max_q_len} "
            "without it"
        )
    if not _arrays.is_tensor(query):
        raise TypeError(
            f"query: expected a DLPack tensor (torch, numpy, cupy, jax), got {type(query).__name__}"
        )

    sparse = _int("sparse_mla_top_k", sparse_mla_top_k) > 0
    packed = _arrays.is_tensor(kv_cache) and _arrays.dtype_name(kv_cache) == "uint8"
    q_shape = _arrays.shape(query)
    topk_lens = None
    if packed:
        # FlashInfer reads this cache on its sm120 sparse path, whose seq_lens are top-k lengths.
        if not sparse:
            raise ValueError(
                f"kv_cache: the packed fp8_ds_mla cache (uint8, {DS_MLA_ROW_BYTES} bytes per "
                "token) is read by FlashInfer's sparse path only: pass sparse_mla_top_k > 0 "
                "(for dense decoding over it, call mla_decode.batch_decode)"
            )
        if cum_seq_lens_q is not None or len(q_shape) != 4:
            raise ValueError(
                f"query: with the packed fp8_ds_mla kv_cache FlashInfer takes a dense "
                f"[B, q_len, H, 576] query without cum_seq_lens_q, got shape {list(q_shape)}"
                f"{' and cum_seq_lens_q' if cum_seq_lens_q is not None else ''}"
            )
        if sparse_mla_top_k_lens is not None:
            raise ValueError(
                "sparse_mla_top_k_lens: with the packed fp8_ds_mla kv_cache, FlashInfer takes the "
                "top-k lengths in seq_lens; pass them there"
            )
        topk_lens = _packed_topk_lens(seq_lens, query)
        # Every listed entry is visible: seq_len = top_k + q_len - 1 puts the contract's causal
        # bound at top_k or beyond for each query token.
        visible = int(sparse_mla_top_k) + q_shape[1] - 1
        seq_lens = _arrays.full_int32(query, (q_shape[0],), visible)
        max_seq_len = visible
    else:
        if seq_lens is None:
            raise ValueError(
                "seq_lens: expected an int32 [B] tensor, got None (only the sparse path over the "
                "packed fp8_ds_mla cache takes None)"
            )
        if sparse_mla_top_k_lens is not None:
            if not sparse:
                raise ValueError(
                    "sparse_mla_top_k_lens: only with sparse_mla_top_k > 0, got a tensor in dense "
                    "mode"
                )
            topk_lens = _per_token_lens(sparse_mla_top_k_lens, query)
    if sparse and not uses_shared_paged_kv_idx:
        raise ValueError(
            "uses_shared_paged_kv_idx: False (separate K and V page tables) applies to dense "
            "mode; with sparse_mla_top_k > 0 block_tables holds the sparse indices"
        )
    if not sparse:
        _check_page_table_layout(block_tables, bool(uses_shared_paged_kv_idx))
    dcp_mask = None
    if enable_dcp:
        seq_lens, dcp_mask = _dcp_local_args(
            query, seq_lens, cp_world, cp_rank, causal_seqlens_kv_global, return_lse, sparse,
            cum_seq_lens_q, sinks,
        )

    if out is None and isinstance(kv_lora_rank, numbers.Integral) and kv_lora_rank > 0:
        out = _arrays.empty(
            query, q_shape[:-1] + (int(kv_lora_rank),), _arrays.bfloat16_or_float16(query)
        )
    ours_lse = _lse_as_ours(lse, query) if return_lse else None
    if enable_pdl is None:
        enable_pdl = _arrays.is_cuda(query)
    result = batch_decode(
        query,
        kv_cache,
        None if sparse else block_tables,
        seq_lens,
        workspace=_arrays.byte_view(workspace_buffer)
        if _arrays.is_tensor(workspace_buffer)
        else workspace_buffer,
        out=out,
        lse=ours_lse,
        return_lse=return_lse,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        qk_nope_head_dim=qk_nope_head_dim,
        max_seq_len=max_seq_len,
        cum_seq_lens_q=cum_seq_lens_q,
        max_q_len=max_q_len,
        sinks=_single_sinks(sinks),
        mask=dcp_mask,
        sparse_indices=block_tables if sparse else None,
        sparse_topk_lens=topk_lens,
        sparse_top_k=sparse_mla_top_k,
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
        enable_pdl=enable_pdl,
        backend=backend,
        stream=stream,
    )
    if not return_lse:
        return result
    out_t, lse_t = result
    if lse is not None:
        return out_t, lse  # the caller's tensor, in the caller's layout
    if len(q_shape) == 4:
        lse_t = _arrays.reshaped(lse_t, (q_shape[0] * q_shape[1], q_shape[2]), "lse", view=False)
    return out_t, lse_t
