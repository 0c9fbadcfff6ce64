"""trtllm_batch_decode_with_kv_cache_mla: FlashInfer's signature, the same answers as batch_decode,
and explicit refusals (Blackwell backend names, unsupported arguments)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import mla_decode
from cases import make_case, sparse_case
from mla_decode import trtllm_batch_decode_with_kv_cache_mla as fi_decode

# FlashInfer's parameters, in order, with defaults (flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla).
FLASHINFER_SIGNATURE = [
    ("query", inspect.Parameter.empty),
    ("kv_cache", inspect.Parameter.empty),
    ("workspace_buffer", inspect.Parameter.empty),
    ("qk_nope_head_dim", inspect.Parameter.empty),
    ("kv_lora_rank", inspect.Parameter.empty),
    ("qk_rope_head_dim", inspect.Parameter.empty),
    ("block_tables", inspect.Parameter.empty),
    ("seq_lens", inspect.Parameter.empty),
    ("max_seq_len", inspect.Parameter.empty),
    ("sparse_mla_top_k", 0),
    ("out", None),
    ("bmm1_scale", 1.0),
    ("bmm2_scale", 1.0),
    ("sinks", None),
    ("skip_softmax_threshold_scale_factor", None),
    ("enable_pdl", None),
    ("backend", "auto"),
    ("is_var_seq", True),
    ("uses_shared_paged_kv_idx", True),
    ("lse", None),
    ("return_lse", False),
    ("cum_seq_lens_q", None),
    ("max_q_len", None),
]


def test_signature_matches_flashinfer():
    params = list(inspect.signature(fi_decode).parameters.values())
    positional = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.default) for p in positional] == FLASHINFER_SIGNATURE
    assert all(p.kind == p.KEYWORD_ONLY for p in params[len(positional):])


def workspace_buffer(size=1 << 20):
    return np.full(size, -1, np.int8)  # FlashInfer callers pass int8 buffers


def fi_args(case, max_seq_len=None):
    max_seq_len = max_seq_len or case.block_tables.shape[1] * case.kv_cache.shape[-2]
    return (case.query, case.kv_cache, workspace_buffer(), 128, case.kv_lora_rank,
            case.qk_rope_head_dim, case.block_tables, case.seq_lens, max_seq_len)


@pytest.mark.parametrize("kv_4d", [False, True])
def test_dense_same_as_batch_decode(rng, kv_4d):
    case = make_case(rng, batch=3, q_len=2, heads=4, kv_4d=kv_4d)
    scale = case.extra["bmm1_scale"]
    sinks = rng.standard_normal(4).astype(np.float32)
    out, lse = fi_decode(*fi_args(case), bmm1_scale=scale, bmm2_scale=0.5, sinks=[sinks],
                         return_lse=True)
    ref_out, ref_lse = mla_decode.batch_decode(*case.args(), return_lse=True,
                                               **case.kwargs(bmm2_scale=0.5, sinks=sinks))
    np.testing.assert_array_equal(out, ref_out)
    # FlashInfer's lse layout: [B * q_len, H].
    assert lse.shape == (3 * 2, 4)
    np.testing.assert_array_equal(lse, ref_lse.reshape(6, 4))


def test_outputs_given_and_scale_tensors(rng):
    case = make_case(rng, batch=2, q_len=3)
    out = np.full(case.query.shape[:-1] + (case.kv_lora_rank,), np.nan, np.float16)
    lse = np.full((2 * 3, case.num_heads), np.nan, np.float32)
    scale = np.array([case.extra["bmm1_scale"]], np.float32)
    got_out, got_lse = fi_decode(*fi_args(case), out=out, lse=lse, return_lse=True,
                                 bmm1_scale=scale, bmm2_scale=np.array([2.0], np.float32))
    assert got_out is out and got_lse is lse
    ref_out, ref_lse = mla_decode.batch_decode(*case.args(), return_lse=True,
                                               **case.kwargs(bmm2_scale=2.0))
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse.reshape(2, 3, -1), ref_lse)


def test_sparse_block_tables_carry_the_indices(rng):
    case = make_case(rng, batch=2, q_len=2, seq_lens=[7, 20])
    indices = sparse_case(rng, case, 8)
    lens = np.array([8, 3], np.int32)
    args = list(fi_args(case))
    args[6] = indices
    out = fi_decode(*args, sparse_mla_top_k=8, bmm1_scale=case.extra["bmm1_scale"],
                    sparse_mla_top_k_lens=lens)
    ref = mla_decode.batch_decode(
        case.query, case.kv_cache, None, case.seq_lens,
        **case.kwargs(sparse_indices=indices, sparse_top_k=8, sparse_topk_lens=lens),
    )
    np.testing.assert_array_equal(out, ref)


def test_ragged_queries(rng):
    case = make_case(rng, ragged_q_lens=[2, 1, 3], seq_lens=[4, 9, 3])
    out, lse = fi_decode(*fi_args(case), bmm1_scale=case.extra["bmm1_scale"], return_lse=True,
                         cum_seq_lens_q=case.cum_seq_lens_q, max_q_len=3)
    ref_out, ref_lse = mla_decode.batch_decode(*case.args(), return_lse=True,
                                               **case.kwargs(max_q_len=3))
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)


def test_accepted_compatibility_arguments(rng):
    case = make_case(rng, batch=2)
    ref = mla_decode.batch_decode(*case.args(), **case.kwargs())
    for kw in (dict(is_var_seq=False), dict(enable_pdl=None), dict(enable_pdl=False),
               dict(backend="cpu"), dict(skip_softmax_threshold_scale_factor=1e-30)):
        out = fi_decode(*fi_args(case), bmm1_scale=case.extra["bmm1_scale"], **kw)
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("backend", ["trtllm-gen", "xqa", "cute-dsl"])
def test_blackwell_backends_raise(rng, backend):
    case = make_case(rng, batch=1)
    with pytest.raises(ValueError, match="^backend: .*Blackwell.*'auto', 'sm90' .*'cpu'"):
        fi_decode(*fi_args(case), backend=backend)


def test_unsupported_arguments_raise_not_implemented(rng):
    case = make_case(rng, batch=1)
    with pytest.raises(NotImplementedError, match="uses_shared_paged_kv_idx=False"):
        fi_decode(*fi_args(case), uses_shared_paged_kv_idx=False)


def test_workspace_buffer_too_small(rng):
    case = make_case(rng, batch=2)
    needed = mla_decode.workspace_size(*case.args(), **case.kwargs())
    args = list(fi_args(case))
    args[2] = np.zeros(needed - 1, np.uint8)
    with pytest.raises(ValueError, match=f"^workspace: expected at least {needed} bytes"):
        fi_decode(*args)


def test_sinks_list_of_two_is_refused(rng):
    case = make_case(rng, batch=1)
    sinks = np.zeros(case.num_heads, np.float32)
    with pytest.raises(ValueError, match="^sinks"):
        fi_decode(*fi_args(case), sinks=[sinks, sinks])
