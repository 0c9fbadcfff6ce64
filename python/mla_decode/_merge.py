"""merge_states: the exact merge of partial attention states (docs/contract.md section 7)."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from . import _arrays
from ._api import Tensor, _output, _tensor, check_backend
from ._lib import lib


def merge_states(
    out_parts: Tensor,
    lse_parts: Tensor,
    *,
    out: Optional[Tensor] = None,
    lse: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    return_lse: bool = False,
    backend: str = "auto",
    enable_pdl: bool = False,
    stream: Any = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Merges N partial states (out_r, lse_r), computed over disjoint key sets (context-parallel
    ranks), into the state over all keys:

        lse = log(sum_r exp(lse_r)),  out = sum_r exp(lse_r - lse) * out_r

    then, with ``sinks``, ``out *= 1 / (1 + exp(sink_h - lse))`` (the sink applied once; lse never
    includes it). A part with lse_r = -inf (no key) contributes nothing; a NaN lse_r makes the row
    NaN. Arithmetic in fp32; out rounded once (docs/context-parallel.md has the error bound).

    Args:
        out_parts: ``[N, T, H, L]`` or ``[N, B, q_len, H, L]`` bfloat16 or float16, last dim
            contiguous (the decode's out of each part, stacked).
        lse_parts: ``[N, T, H]`` or ``[N, B, q_len, H]`` float32 (the decode's lse of each part).
        out: ``out_parts.shape[1:]``, out_parts' dtype. Default: allocated.
        lse: ``lse_parts.shape[1:]`` float32; written when given, allocated with ``return_lse``.
        sinks: ``[H]`` float32, bfloat16 or float16 per-head sink logits, or None.
        return_lse: return ``(out, lse)``.
        backend: "auto", "sm90" or "cpu". enable_pdl: programmatic dependent launch (sm90).
        stream: a CUDA stream (default: the caller's current stream).
    """
    out_parts = _tensor("out_parts", out_parts, required=True)
    lse_parts = _tensor("lse_parts", lse_parts, required=True)
    sinks = _tensor("sinks", sinks)
    out = _output("out", out)
    lse = _output("lse", lse)
    backend = check_backend(backend)
    parts_shape = _arrays.shape(out_parts)
    lse_shape = _arrays.shape(lse_parts)
    if len(parts_shape) not in (4, 5):
        raise ValueError(
            f"out_parts: expected rank 4 [N, T, H, L] or 5 [N, B, q_len, H, L], got shape "
            f"{list(parts_shape)}"
        )
    if out is None:
        out = _arrays.empty(out_parts, parts_shape[1:], _arrays.dtype_name(out_parts))
    if lse is None and return_lse:
        lse = _arrays.empty(out_parts, lse_shape[1:], "float32")
    result_out, result_lse = out, lse
    if len(parts_shape) == 5:
        n, b, q, h, width = parts_shape
        out_parts = _arrays.reshaped(out_parts, (n, b * q, h, width), "out_parts", view=True)
        lse_parts = _arrays.reshaped(lse_parts, (n, b * q, h), "lse_parts", view=True)
        out = _arrays.reshaped(out, (b * q, h, width), "out", view=True)
        if lse is not None:
            lse = _arrays.reshaped(lse, (b * q, h), "lse", view=True)
    parts_view, parts_code = _arrays.ffi_view(out_parts)
    out_view, out_code = _arrays.ffi_view(out)
    stream_handle = _arrays.stream_handle(stream)
    if stream_handle is None:
        stream_handle = _arrays.current_stream(out_parts)
    lib().merge_states(
        parts_view,
        lse_parts,
        sinks,
        out_view,
        lse,
        backend,
        bool(enable_pdl),
        stream_handle,
        parts_code,
        out_code,
    )
    if return_lse:
        return result_out, result_lse
    return result_out
