"""FlashInfer-compatible entry point: ``trtllm_batch_decode_with_kv_cache_mla``.

Same names, order and defaults as FlashInfer's function, so an engine can switch by changing the
import. Differences are explicit: Blackwell backend names raise ValueError, arguments this library
cannot honour raise NotImplementedError naming them, and the default ``out`` dtype follows SPEC.md
(the query's when 16-bit, else bfloat16; FlashInfer's trtllm-gen path always uses bfloat16).
"""

from __future__ import annotations

import numbers
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _arrays
from ._api import Scale, Tensor, batch_decode, check_backend


def _single_sinks(sinks: Union[None, Tensor, Sequence[Tensor]]) -> Optional[Tensor]:
    """FlashInfer types sinks as Optional[List[Tensor]] but every backend takes one [H] tensor."""
    if sinks is None or _arrays.is_tensor(sinks):
        return sinks
    if isinstance(sinks, (list, tuple)):
        if len(sinks) != 1:
            raise ValueError(
                f"sinks: expected one [H] float32 tensor (or a list holding one), got a list of "
                f"{len(sinks)}"
            )
        return sinks[0]
    raise TypeError(f"sinks: expected a float32 tensor [H], got {type(sinks).__name__}")


def _lse_as_ours(lse: Optional[Tensor], query: Tensor) -> Optional[Tensor]:
    """FlashInfer's lse for a dense [B, q_len, H, D] query is [B * q_len, H]; ours [B, q_len, H]."""
    if lse is None or len(_arrays.shape(query)) != 4 or len(_arrays.shape(lse)) != 2:
        return lse
    b, q_len, h = _arrays.shape(query)[:3]
    if _arrays.shape(lse) != (b * q_len, h):
        return lse  # validation names the expected shape
    shape = (b, q_len, h)
    framework = _arrays.framework(lse)
    if framework == "torch":
        return lse.view(shape)
    if framework == "numpy":
        import numpy as np

        try:
            try:
                return np.reshape(lse, shape, copy=False)  # NumPy >= 2.1: raises, never copies
            except TypeError:
                view = lse.view()
                view.shape = shape  # older NumPy: the same guarantee
                return view
        except (ValueError, AttributeError) as e:
            raise ValueError(
                f"lse: expected a [B * q_len, H] tensor viewable as [B, q_len, H], got strides "
                f"{lse.strides}"
            ) from e
    if not lse.flags.c_contiguous:
        raise ValueError("lse: expected a contiguous [B * q_len, H] tensor")
    return lse.reshape(shape)


def trtllm_batch_decode_with_kv_cache_mla(
    query: Tensor,
    kv_cache: Tensor,
    workspace_buffer: Tensor,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: Tensor,
    seq_lens: Tensor,
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
    cum_seq_lens_q: Optional[Tensor] = None,
    max_q_len: Optional[int] = None,
    *,
    sparse_mla_top_k_lens: Optional[Tensor] = None,
    stream: Any = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """MLA decode with FlashInfer's ``trtllm_batch_decode_with_kv_cache_mla`` signature.

    Args:
        query: ``[B, q_len, H, D]`` (or ``[T, H, D]`` with ``cum_seq_lens_q``), D = kv_lora_rank +
            qk_rope_head_dim, ``[q_nope_absorbed | q_pe]``.
        kv_cache: ``[P, page_size, D]`` or ``[P, 1, page_size, D]``.
        workspace_buffer: the caller's scratch buffer, any dtype, contiguous; its bytes must number
            at least ``mla_decode.workspace_size(...)`` (a 128 MiB buffer as FlashInfer users
            allocate is ample); it need not be zeroed.
        qk_nope_head_dim: informational, must be positive.
        kv_lora_rank, qk_rope_head_dim: L and R.
        block_tables: ``[B, max_pages]`` int32 page table; with ``sparse_mla_top_k > 0`` the sparse
            indices ``[B, q_len, top_k]`` int32 (flat slots ``page * page_size + offset``).
        seq_lens: ``[B]`` int32, tokens per request including the query tokens.
        max_seq_len: host upper bound of seq_lens (at most the block tables' capacity).
        sparse_mla_top_k: top_k of sparse MLA (DeepSeek-V3.2); 0 for dense.
        out: ``[..., L]`` bfloat16/float16. Default: allocated (query's dtype if 16-bit, else bf16).
        bmm1_scale, bmm2_scale: float or 1-element float32 tensor (natural-log scale; no log2e).
        sinks: one ``[H]`` float32 tensor, or a list holding one.
        skip_softmax_threshold_scale_factor: enables skip-softmax when given.
        enable_pdl: None: on for CUDA tensors (Hopper supports PDL), off on the host.
        backend: "auto", "sm90" or "cpu"; "trtllm-gen", "xqa", "cute-dsl" raise ValueError.
        is_var_seq: accepted for compatibility; every call supports per-request lengths.
        uses_shared_paged_kv_idx: must be True (one page table shared by K and V, as MLA's latent
            rows are); False (TRT-LLM's [B, 2, max_pages] layout) raises NotImplementedError.
        lse: FlashInfer's ``[B * q_len, H]`` float32 (``[B, q_len, H]`` and ragged ``[T, H]``
            also accepted).
        return_lse: return ``(out, lse)``; lse in FlashInfer's ``[B * q_len, H]`` layout.
        cum_seq_lens_q, max_q_len: ragged queries (query ``[T, H, D]``).
        sparse_mla_top_k_lens: keyword-only, ``[B]``/``[B, q_len]`` int32 valid top-k entries.
        stream: keyword-only, explicit CUDA stream (default: the caller's current stream).
    """
    check_backend(backend)
    if not uses_shared_paged_kv_idx:
        raise NotImplementedError(
            "uses_shared_paged_kv_idx=False: separate K and V page tables ([B, 2, max_pages], "
            "TRT-LLM's layout) are not supported; MLA keys and values share one latent row, so "
            "pass the single [B, max_pages] page table with uses_shared_paged_kv_idx=True"
        )
    del is_var_seq  # every call handles per-request sequence lengths
    if enable_pdl is None:
        enable_pdl = _arrays.is_tensor(query) and _arrays.is_cuda(query)
    sparse = isinstance(sparse_mla_top_k, numbers.Integral) and sparse_mla_top_k > 0
    query_is_dense = _arrays.is_tensor(query) and len(_arrays.shape(query)) == 4
    ours_lse = _lse_as_ours(lse, query) if _arrays.is_tensor(query) else lse
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
        sparse_indices=block_tables if sparse else None,
        sparse_topk_lens=sparse_mla_top_k_lens,
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
    if query_is_dense:
        b, q_len, h = _arrays.shape(query)[:3]
        lse_t = lse_t.reshape(b * q_len, h)
    return out_t, lse_t
