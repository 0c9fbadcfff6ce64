"""A float64 NumPy reference of MLA decode, written from docs/contract.md sections 1 and 2 alone.

It shares nothing with the library: inputs are decoded to float64 by NumPy/ml_dtypes (the
fp8_ds_mla cache by decode_fp8_ds_mla), every query token's attended key set is enumerated
literally, and the softmax is evaluated in two passes. A NaN or inf in a query row, in an attended
key or in a scale makes that row's out and lse NaN; a row without keys is out 0, lse -inf.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np


def _f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _scalar(x: Any) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


# fp8_ds_mla (DeepSeek-V3.2's cache row; docs/contract.md, 1): 656 bytes = 512 float8_e4m3fn values,
# 4 float32 scales (scale g multiplies values [128g, 128g + 128)), 64 bfloat16 rope values.
FP8_DS_MLA_ROW_BYTES = 656


def decode_fp8_ds_mla(cache: Any) -> np.ndarray:
    """[..., 656] uint8 rows -> [..., 576] float64 keys (512 dequantized values, 64 rope values)."""
    import ml_dtypes

    rows = np.ascontiguousarray(np.asarray(cache, dtype=np.uint8))
    lead = rows.shape[:-1]
    rows = rows.reshape(-1, FP8_DS_MLA_ROW_BYTES)
    latent = rows[:, :512].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    scales = rows[:, 512:528].copy().view("<f4").astype(np.float64)  # [rows, 4]
    rope = rows[:, 528:].copy().view("<u2").astype(np.uint32) << 16
    keys = np.concatenate(
        [(latent.reshape(-1, 4, 128) * scales[:, :, None]).reshape(-1, 512),
         rope.view(np.float32).astype(np.float64)], axis=1)
    return keys.reshape(lead + (576,))


def _mask_bits(mask: np.ndarray) -> np.ndarray:
    """[tokens, bits] booleans from packed little-endian words (uint32, or uint16 with 2W)."""
    rows = np.ascontiguousarray(mask).reshape(mask.shape[0], mask.shape[-1])
    as_bytes = rows.astype(rows.dtype.newbyteorder("<")).view(np.uint8)
    return np.unpackbits(as_bytes, axis=1, bitorder="little").astype(bool)


def attended_slots(
    b: int,
    i: int,
    t: int,
    n_b: int,
    *,
    seq_lens: np.ndarray,
    block_tables: Optional[np.ndarray],
    page_size: int,
    mask_bits: Optional[np.ndarray],
    sparse_indices: Optional[np.ndarray],
    topk_len: Optional[int],
) -> List[int]:
    """KV pool rows (page * page_size + offset) attended by query token i of request b (global
    token t), docs/contract.md section 2. block_tables is [B, max_pages] (or row 0 of [B, 2, max_pages])."""
    seq_len = int(seq_lens[b])
    if sparse_indices is not None:
        # The first min(top_k, topk_len, seq_len - n_b + i + 1) entries; the last term is the
        # causal bound (the keys visible to token i).
        entries = sparse_indices[t]
        count = len(entries) if topk_len is None else min(len(entries), topk_len)
        count = max(0, min(count, seq_len - n_b + i + 1))
        return [int(s) for s in entries[:count] if s != -1]
    first = seq_len - n_b  # position of query token 0; may be negative
    slots = []
    for j in range(seq_len):
        if mask_bits is not None:
            attended = j < first or bool(mask_bits[t, j - first])
        else:
            attended = j <= first + i  # causal: keys 0 .. p_i
        if attended:
            slots.append(int(block_tables[b, j // page_size]) * page_size + j % page_size)
    return slots


def reference(
    query: Any,
    kv_cache: Any,
    block_tables: Optional[Any],
    seq_lens: Any,
    *,
    kv_lora_rank: int,
    cum_seq_lens_q: Optional[Any] = None,
    sinks: Optional[Any] = None,
    mask: Optional[Any] = None,
    sparse_indices: Optional[Any] = None,
    sparse_topk_lens: Optional[Any] = None,
    bmm1_scale: Any = 1.0,
    bmm2_scale: Any = 1.0,
) -> Tuple[np.ndarray, np.ndarray]:
    """(out, lse) in float64 with the query's leading dims: out [..., H, L], lse [..., H]."""
    q = _f64(query)
    kv_cache = np.asarray(kv_cache)
    kv = decode_fp8_ds_mla(kv_cache) if kv_cache.dtype == np.uint8 else _f64(kv_cache)
    page_size = kv.shape[-2]
    D = kv.shape[-1]
    L = kv_lora_rank
    pool = kv.reshape(-1, D)  # row `page * page_size + offset`
    seq_lens = np.asarray(seq_lens)
    B = len(seq_lens)
    H = q.shape[-2]

    if cum_seq_lens_q is not None:
        cu = np.asarray(cum_seq_lens_q).astype(np.int64)
        starts, n = cu[:-1], np.diff(cu)
        tokens = q
    else:
        q_len = q.shape[1]
        starts, n = np.arange(B) * q_len, np.full(B, q_len)
        tokens = q.reshape(-1, H, D)
    T = tokens.shape[0]

    # NOTE: the last dim by name, not -1: T may be 0.
    bits = None if mask is None else _mask_bits(np.asarray(mask).reshape(T, np.shape(mask)[-1]))
    sparse = (None if sparse_indices is None
              else np.asarray(sparse_indices).reshape(T, np.shape(sparse_indices)[-1]))
    lens = None if sparse_topk_lens is None else np.asarray(sparse_topk_lens)
    s1, s2 = _scalar(bmm1_scale), _scalar(bmm2_scale)
    sink = None if sinks is None else _f64(sinks)

    if block_tables is not None and np.ndim(block_tables) == 3:
        block_tables = np.asarray(block_tables)[:, 0]  # K and V tables name the same pages

    out = np.zeros((T, H, L))
    lse = np.full((T, H), -np.inf)
    scales_finite = np.isfinite(s1) and np.isfinite(s2)
    for b in range(B):
        for i in range(int(n[b])):
            t = int(starts[b]) + i
            topk_len = None
            if lens is not None:  # [B] per request (dense queries), else per token
                per_request = cum_seq_lens_q is None and lens.ndim == 1
                topk_len = int(lens[b] if per_request else lens.reshape(-1)[t])
            slots = attended_slots(
                b,
                i,
                t,
                int(n[b]),
                seq_lens=seq_lens,
                block_tables=None if block_tables is None else np.asarray(block_tables),
                page_size=page_size,
                mask_bits=bits,
                sparse_indices=sparse,
                topk_len=topk_len,
            )
            if not slots:
                continue  # out = 0, lse = -inf
            keys = pool[slots]  # [A, D]
            # A NaN or inf in a query row, an attended key or a scale: that row is NaN.
            nan_rows = ~np.isfinite(tokens[t]).all(axis=1)
            if not scales_finite or not np.isfinite(keys).all():
                nan_rows[:] = True
            with np.errstate(invalid="ignore", over="ignore"):  # the NaN rows are set below
                s = s1 * (tokens[t] @ keys.T)  # [H, A]
                s_max = s.max(axis=1)
                lse[t] = s_max + np.log(np.exp(s - s_max[:, None]).sum(axis=1))
                m = s_max if sink is None else np.maximum(s_max, sink)
                p = np.exp(s - m[:, None])
                z = p.sum(axis=1) + (0.0 if sink is None else np.exp(sink - m))
                out[t] = s2 * (p @ keys[:, :L]) / z[:, None]
            out[t, nan_rows] = np.nan
            lse[t, nan_rows] = np.nan
    lead = q.shape[:-2]
    return out.reshape(lead + (H, L)), lse.reshape(lead + (H,))
