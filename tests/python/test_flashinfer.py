"""trtllm_batch_decode_with_kv_cache_mla gives batch_decode's answers: the same call translated
argument by argument (FlashInfer's layouts on one side, the native ones on the other) must give
bitwise equal results. FlashInfer's own behaviour (signature, defaults, errors, lse base, layouts)
is checked in test_flashinfer_conformance.py."""

from __future__ import annotations

import numpy as np
import pytest

import mla_decode
from cases import make_case, sparse_case
from mla_decode import trtllm_batch_decode_with_kv_cache_mla as fi_decode

ml_dtypes = pytest.importorskip("ml_dtypes")  # FlashInfer's default out is bfloat16
BF16 = ml_dtypes.bfloat16


def workspace_buffer(size=16 << 20):
    return np.full(size, -1, np.int8)  # FlashInfer callers pass int8 buffers


def fi_args(case, max_seq_len=None):
    max_seq_len = max_seq_len or case.block_tables.shape[1] * case.kv_cache.shape[-2]
    return (case.query, case.kv_cache, workspace_buffer(), 128, case.kv_lora_rank,
            case.qk_rope_head_dim, case.block_tables, case.seq_lens, max_seq_len)


def native(case, block_tables="case", **kw):
    """batch_decode of the case with a bfloat16 out (FlashInfer's default), returning (out, lse)."""
    out = np.empty(case.query.shape[:-1] + (case.kv_lora_rank,), BF16)
    tables = case.block_tables if isinstance(block_tables, str) else block_tables
    return mla_decode.batch_decode(case.query, case.kv_cache, tables, case.seq_lens, out=out,
                                   return_lse=True, **case.kwargs(**kw))


@pytest.mark.parametrize("kv_4d", [False, True])
def test_dense_same_as_batch_decode(rng, kv_4d):
    case = make_case(rng, batch=3, q_len=2, heads=4, kv_4d=kv_4d)
    scale = case.extra["bmm1_scale"]
    sinks = rng.standard_normal(4).astype(np.float32)
    out, lse = fi_decode(*fi_args(case), bmm1_scale=scale, bmm2_scale=0.5, sinks=[sinks],
                         return_lse=True)
    ref_out, ref_lse = native(case, bmm2_scale=0.5, sinks=sinks)
    np.testing.assert_array_equal(out, ref_out)
    assert lse.shape == (3 * 2, 4)  # FlashInfer's lse layout: [B * q_len, H]
    np.testing.assert_array_equal(lse, ref_lse.reshape(6, 4))


def test_outputs_given_and_scale_tensors(rng):
    case = make_case(rng, batch=2, q_len=3)
    out = np.full(case.query.shape[:-1] + (case.kv_lora_rank,), np.nan, BF16)
    lse = np.full((2 * 3, case.num_heads), np.nan, np.float32)
    scale = np.array([case.extra["bmm1_scale"]], np.float32)
    got_out, got_lse = fi_decode(*fi_args(case), out=out, lse=lse, return_lse=True,
                                 bmm1_scale=scale, bmm2_scale=np.array([2.0], np.float32))
    assert got_out is out and got_lse is lse
    ref_out, ref_lse = native(case, bmm2_scale=2.0)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse.reshape(2, 3, -1), ref_lse)


def test_sparse_block_tables_carry_the_indices(rng):
    case = make_case(rng, batch=2, q_len=2, seq_lens=[12, 20])
    indices = sparse_case(rng, case, 8)
    lens = np.array([8, 3, 5, 0], np.int32)  # FlashInfer's layout: one per query token, flat
    args = list(fi_args(case))
    args[6] = indices
    out = fi_decode(*args, sparse_mla_top_k=8, bmm1_scale=case.extra["bmm1_scale"],
                    sparse_mla_top_k_lens=lens)
    ref_out, _ = native(case, block_tables=None, sparse_indices=indices, sparse_top_k=8,
                        sparse_topk_lens=lens.reshape(2, 2))
    np.testing.assert_array_equal(out, ref_out)


def test_ragged_queries(rng):
    case = make_case(rng, ragged_q_lens=[2, 1, 3], seq_lens=[4, 9, 3])
    out, lse = fi_decode(*fi_args(case), bmm1_scale=case.extra["bmm1_scale"], return_lse=True,
                         cum_seq_lens_q=case.cum_seq_lens_q, max_q_len=3)
    ref_out, ref_lse = native(case, max_q_len=3)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)


def test_ragged_sparse_queries(rng):
    case = make_case(rng, ragged_q_lens=[2, 1], seq_lens=[14, 9])
    indices = sparse_case(rng, case, 6)
    lens = np.array([6, 2, 4], np.int32)  # [T]
    args = list(fi_args(case))
    args[6] = indices
    out = fi_decode(*args, sparse_mla_top_k=6, bmm1_scale=case.extra["bmm1_scale"],
                    cum_seq_lens_q=case.cum_seq_lens_q, sparse_mla_top_k_lens=lens)
    ref_out, _ = native(case, block_tables=None, sparse_indices=indices, sparse_top_k=6,
                        sparse_topk_lens=lens)
    np.testing.assert_array_equal(out, ref_out)


def test_workspace_buffer_too_small(rng):
    case = make_case(rng, batch=2)
    needed = mla_decode.workspace_size(*case.args(), **case.kwargs())
    args = list(fi_args(case))
    args[2] = np.zeros(needed - 1, np.uint8)
    with pytest.raises(ValueError, match=f"^workspace: expected at least {needed} bytes"):
        fi_decode(*args)
