"""Context parallelism on the cpu backend (NumPy): merge_states against a float64 merge written from
docs/contract.md section 7, and simulated ranks: a request's KV sharded over N virtual ranks (token
t on rank t % N), each rank's local decode with FlashInfer's DCP semantics
(mla_decode.distributed), the merge, compared with the single decode of the whole sequence.

Error bound (docs/context-parallel.md): each rank's out is rounded once to the out dtype and the
merge rounds once more; with weights summing to 1 the merged out is within 2 half-ulps of the
largest |value| of the row, plus fp32 noise; lse within fp32 noise.
"""

from __future__ import annotations

import numpy as np
import pytest

import mla_decode
from cases import make_case
from mla_decode import distributed
from mla_decode import trtllm_batch_decode_with_kv_cache_mla as fi_decode

ml_dtypes = pytest.importorskip("ml_dtypes")


def merge_oracle(out_parts, lse_parts, sinks=None):
    """float64 merge: lse = log sum exp lse_r, out = sum exp(lse_r - lse) out_r, sink once."""
    out_parts = out_parts.astype(np.float64)
    lse_parts = lse_parts.astype(np.float64)
    n = lse_parts.shape[0]
    out = np.zeros(out_parts.shape[1:])
    lse = np.full(lse_parts.shape[1:], -np.inf)
    for idx in np.ndindex(*lse_parts.shape[1:]):
        ls = lse_parts[(slice(None),) + idx]
        if np.isnan(ls).any() or np.isposinf(ls).any():
            out[idx], lse[idx] = np.nan, np.nan
            continue
        if np.isneginf(ls).all():
            continue
        m = ls.max()
        total = m + np.log(np.exp(ls - m).sum())
        factor = 1.0 if sinks is None else 1.0 / (1.0 + np.exp(float(sinks[idx[-1]]) - total))
        for r in range(n):
            if ls[r] != -np.inf:
                out[idx] += np.exp(ls[r] - total) * factor * out_parts[(r,) + idx]
        lse[idx] = total
    return out, lse


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_merge_states_matches_oracle(rng, n, dtype, with_sinks):
    t, h, width = 6, 16, 40
    np_dtype = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    parts = rng.uniform(-2, 2, (n, t, h, width)).astype(np_dtype)
    lse = rng.uniform(-5, 12, (n, t, h)).astype(np.float32)
    lse[:, 0, :3] = -np.inf  # a row without keys anywhere
    lse[0, 1, :] = -np.inf  # one rank empty
    parts[0, 1, :] = np.nan  # an empty rank's out is never read
    lse[n - 1, 2, 5] = np.nan  # a NaN part: the row turns NaN
    sinks = rng.uniform(-2, 14, h).astype(np.float32) if with_sinks else None
    out = np.full((t, h, width), np.nan, dtype=np_dtype)
    merged_lse = np.full((t, h), np.nan, dtype=np.float32)
    mla_decode.merge_states(parts, lse, out=out, lse=merged_lse, sinks=sinks)
    ref_out, ref_lse = merge_oracle(parts.astype(np.float64), lse, sinks)
    half_ulp = 2.0**-12 if dtype == "float16" else 2.0**-9
    got = out.astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(ref_out))
    assert np.array_equal(np.isnan(merged_lse), np.isnan(ref_lse))
    finite = ~np.isnan(ref_out)
    err = np.abs(got - ref_out)[finite]
    # one rounding of out: at most twice the smallest relative half ulp
    allowed = (2 * half_ulp * np.abs(ref_out) + 2.0**-20 + 2.0**-24)[finite]
    assert (err <= allowed).all(), float((err / allowed).max())
    ok = ~np.isnan(ref_lse)
    assert np.allclose(merged_lse[ok], ref_lse[ok], rtol=2e-6, atol=2e-6)
    assert (merged_lse[0, :3] == -np.inf).all() and (got[0, :3] == 0).all()


def test_merge_states_refuses_bad_arguments(rng):
    parts = np.zeros((2, 3, 4, 8), np.float16)
    lse = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="^lse_parts: expected heads H 4"):
        mla_decode.merge_states(parts, np.zeros((2, 3, 5), np.float32))
    with pytest.raises(TypeError, match="^out_parts: expected dtype bfloat16 or float16"):
        mla_decode.merge_states(parts.astype(np.float32), lse)
    with pytest.raises(ValueError, match="^out: overlaps out_parts"):
        mla_decode.merge_states(parts, lse, out=parts[0])
    with pytest.raises(ValueError, match="^out_parts: expected rank 4"):
        mla_decode.merge_states(parts[0], lse)


# ---- simulated ranks ---------------------------------------------------------------------------


def shard(case, world):
    """Each virtual rank's (kv_cache, block_tables, local seq_lens): token t of request b on rank
    t % world at local index t // world, pages of the case's page size; unused rows NaN."""
    kv, tables, lens = case.kv_cache, case.block_tables, case.seq_lens
    page_size, width = kv.shape[1], kv.shape[2]
    ranks = []
    for r in range(world):
        local_lens = [max(0, -(-(int(g) - r) // world)) for g in lens]
        pages = [max(1, -(-n // page_size)) for n in local_lens]
        pool = np.full((sum(pages) + 1, page_size, width), np.nan, dtype=np.float32)
        table = np.full((len(lens), max(pages) + 1), 10**6, dtype=np.int32)
        next_page = 0
        for b, n in enumerate(local_lens):
            for p in range(pages[b]):
                table[b, p] = next_page
                next_page += 1
            for k in range(n):
                t = k * world + r
                src = kv[tables[b, t // page_size], t % page_size].astype(np.float32)
                pool[table[b, k // page_size], k % page_size] = src
        ranks.append((pool.astype(kv.dtype), table, np.asarray(local_lens, np.int32)))
    return ranks


def assert_within_cp_bound(got, want, parts, lses, lse, full_lse, sinks):
    """The bound of docs/context-parallel.md: the single decode rounds out once (half an ulp of
    |want|), each rank rounds its partial out once (half an ulp of each |out_r|, weighted:
    out_abs = sum_r exp(lse_r - lse) |out_r|), the merge rounds once (half an ulp of |got|); the
    fp32 sums in different orders add about 2^-16 of the row's largest value."""
    half_ulp = 2.0**-8  # bfloat16 out (the query's dtype): at most 2^-8 of |x|
    lse64 = np.where(np.isneginf(full_lse), 0.0, full_lse.astype(np.float64))
    weights = np.exp(np.where(np.isneginf(lses), -np.inf, lses.astype(np.float64)) - lse64)
    if sinks is not None:
        weights = weights / (1.0 + np.exp(sinks.astype(np.float64) - lse64))
    out_abs = (weights[..., None] * np.abs(parts.astype(np.float64))).sum(axis=0)
    row_max = np.abs(want).max(axis=-1, keepdims=True)
    allowed = half_ulp * (np.abs(want) + np.abs(got) + 2 * out_abs) + 2.0**-16 * row_max + 2.0**-30
    err = np.abs(got - want)
    assert (err <= allowed).all(), float((err / allowed).max())


CP_CASES = [
    # (heads, q_len, seq_lens or None for random)
    (16, 1, None),
    (16, 2, None),
    (128, 1, [37]),
    (128, 2, [2, 1, 40]),  # ragged, a request shorter than the world at 3 ranks
    (16, 3, [1, 5, 9, 64]),
]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("heads,q_len,seq_lens", CP_CASES)
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_simulated_context_parallel_matches_single_decode(
    rng, world, heads, q_len, seq_lens, kv_dtype, with_sinks
):
    q_dtype = ml_dtypes.bfloat16
    case = make_case(rng, batch=3 if seq_lens is None else len(seq_lens), q_len=q_len,
                     heads=heads, kv_lora_rank=64, rope_dim=16, page_size=4, seq_lens=seq_lens)
    query = case.query.astype(q_dtype)
    kv = case.kv_cache.astype(getattr(ml_dtypes, kv_dtype))
    case.kv_cache = kv
    sinks = rng.uniform(-1, 3, heads).astype(np.float32) if with_sinks else None
    kw = dict(kv_lora_rank=64, qk_rope_head_dim=16, bmm1_scale=case.extra["bmm1_scale"],
              backend="cpu")
    full_out, full_lse = mla_decode.batch_decode(query, kv, case.block_tables, case.seq_lens,
                                                 sinks=sinks, return_lse=True, **kw)
    parts, lses = [], []
    for r, (pool, table, local_lens) in enumerate(shard(case, world)):
        out_r, lse_r = distributed.local_decode(query, pool, table, local_lens, case.seq_lens,
                                                world, r, **kw)
        parts.append(out_r)
        lses.append(lse_r)
    out, lse = mla_decode.merge_states(np.stack(parts), np.stack(lses), sinks=sinks,
                                       return_lse=True)
    got, want = out.astype(np.float64), full_out.astype(np.float64)
    assert not np.isnan(got).any()
    assert_within_cp_bound(got, want, np.stack(parts), np.stack(lses), lse, full_lse, sinks)
    empty = np.isneginf(full_lse)
    assert np.array_equal(np.isneginf(lse), empty)
    assert np.allclose(lse[~empty], full_lse[~empty], rtol=1e-5, atol=1e-5)


def test_local_shard_args_follow_the_global_causal_rule():
    # cp_world 2, seq_len 7, q_len 2 (docs/contract.md section 7): query tokens at global 5 and 6.
    # Rank 0 holds 0, 2, 4, 6: token 0 sees 3 local keys, token 1 all 4. Rank 1 holds 1, 3, 5:
    # both tokens see all 3.
    lens0, mask0 = distributed.local_shard_args(np.array([4], np.int32), np.array([7], np.int32),
                                                2, 2, 0)
    assert lens0.tolist() == [4] and mask0[0, :, 0].tolist() == [0b01, 0b11]
    lens1, mask1 = distributed.local_shard_args(np.array([3], np.int32), np.array([7], np.int32),
                                                2, 2, 1)
    assert lens1.tolist() == [3] and mask1[0, :, 0].tolist() == [0b11, 0b11]
    # One query token sees the whole shard: seq_lens pass through (keys 1, 3, 5, 7 of 0..8).
    lens, mask = distributed.local_shard_args(np.array([4], np.int32), np.array([9], np.int32),
                                              1, 2, 1)
    assert lens.tolist() == [4] and mask is None
    # Two tokens (global 7 and 8) over rank 0's keys 0, 2, 4, 6, 8: global 7 sees local 0..3,
    # global 8 all five.
    lens, mask = distributed.local_shard_args(np.array([5], np.int32), np.array([9], np.int32),
                                              2, 2, 0)
    assert lens.tolist() == [5] and mask[0, :, 0].tolist() == [0b01, 0b11]


def test_flashinfer_dcp_arguments_give_the_local_state(rng):
    world = 2
    case = make_case(rng, batch=2, q_len=2, heads=16, kv_lora_rank=64, rope_dim=16,
                     seq_lens=[9, 30])
    query = case.query.astype(ml_dtypes.bfloat16)
    kv = case.kv_cache.astype(ml_dtypes.bfloat16)
    case.kv_cache = kv
    scale = case.extra["bmm1_scale"]
    full_out, full_lse = fi_decode(query, kv, np.zeros(1 << 20, np.uint8), 128, 64, 16,
                                   case.block_tables, case.seq_lens,
                                   case.block_tables.shape[1] * 4, bmm1_scale=scale,
                                   return_lse=True, backend="cpu")
    parts, lses = [], []
    for r, (pool, table, local_lens) in enumerate(shard(case, world)):
        # max_seq_len bounds the LOCAL lengths (the rank's block table capacity here).
        o, l = fi_decode(query, pool, np.zeros(1 << 20, np.uint8), 128, 64, 16, table,
                         local_lens, table.shape[1] * 4, bmm1_scale=scale, return_lse=True, backend="cpu",
                         enable_dcp=True, cp_world=world, cp_rank=r,
                         causal_seqlens_kv_global=case.seq_lens)
        parts.append(o.reshape(2, 2, 16, 64))
        lses.append(l.reshape(2, 2, 16))
    out, lse = mla_decode.merge_states(np.stack(parts), np.stack(lses), return_lse=True)
    assert_within_cp_bound(out.astype(np.float64), full_out.astype(np.float64), np.stack(parts),
                           np.stack(lses), lse, full_lse.reshape(2, 2, 16), None)


@pytest.mark.parametrize(
    "kw,error,match",
    [(dict(return_lse=False), ValueError, "^return_lse: "),
     (dict(cp_rank=2), ValueError, "^cp_rank: "),
     (dict(causal_seqlens_kv_global=None), ValueError, "^causal_seqlens_kv_global: required"),
     (dict(sinks=np.zeros(4, np.float32)), ValueError, "^sinks: ")],
)
def test_flashinfer_dcp_refusals(rng, kw, error, match):
    case = make_case(rng, batch=1)
    args = dict(return_lse=True, enable_dcp=True, cp_world=2, cp_rank=1,
                causal_seqlens_kv_global=case.seq_lens)
    args.update(kw)
    with pytest.raises(error, match=match):
        fi_decode(case.query, case.kv_cache, np.zeros(1 << 16, np.uint8), 128, 32, 16,
                  case.block_tables, case.seq_lens, 64, backend="cpu", **args)
