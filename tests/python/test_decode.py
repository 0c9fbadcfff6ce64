"""batch_decode and plan/run through the cpu backend (NumPy inputs) against the float64 reference.

Every feature of docs/contract.md: dense and ragged queries, causal q_len > 1, custom masks (uint32 and uint16),
sinks (float32, bfloat16, float16), scales as floats and 1-element arrays, sparse top-k with and
without lens (and its causal bound), skip-softmax, lse, empty sequences, B = 0, head dims with
R = 0, separate K/V page tables, the fp8_ds_mla cache, and NaN/inf inputs. Outputs are
NaN-poisoned before each call and the KV pool holds NaN wherever a read would be wrong (cases.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import mla_decode
from cases import fp8_ds_mla_cache, make_case, random_mask, sparse_case
from tolerance import assert_lse_close, assert_out_close


def check(out, lse, ref_out, ref_lse):
    """out and lse against the reference within the error model of tolerance.py (out's own dtype
    names its rounding)."""
    assert_out_close(out, ref_out)
    if lse is not None:
        assert_lse_close(lse, ref_lse)


def run_case(case, **overrides):
    outputs = case.poisoned_outputs()
    kw = case.kwargs(**overrides)
    out, lse = mla_decode.batch_decode(*case.args(), **outputs, return_lse=True, **kw)
    assert out is outputs["out"] and lse is outputs["lse"], "given outputs are written in place"
    return out, lse


@pytest.mark.parametrize(
    "batch,q_len,heads,page_size,kv_4d",
    [(1, 1, 1, 1, False), (3, 1, 4, 4, False), (4, 1, 8, 16, True), (2, 2, 4, 8, False),
     (3, 4, 2, 4, True)],
)
def test_dense_matches_reference(rng, batch, q_len, heads, page_size, kv_4d):
    case = make_case(rng, batch=batch, q_len=q_len, heads=heads, page_size=page_size, kv_4d=kv_4d)
    out, lse = run_case(case)
    check(out, lse, *case.reference())


def test_deepseek_shapes(rng):
    # L 512 + R 64, 16 heads, two MTP tokens per request, pages of 64.
    case = make_case(rng, batch=2, q_len=2, heads=16, kv_lora_rank=512, rope_dim=64,
                     page_size=64, seq_lens=[70, 130])
    out, lse = run_case(case)
    check(out, lse, *case.reference())


@pytest.mark.parametrize("kv_lora_rank,rope_dim", [(256, 64), (512, 0), (32, 0)])
def test_other_head_dims(rng, kv_lora_rank, rope_dim):
    case = make_case(rng, batch=2, q_len=2, heads=8, kv_lora_rank=kv_lora_rank, rope_dim=rope_dim,
                     page_size=16, seq_lens=[40, 3])
    out, lse = run_case(case)
    check(out, lse, *case.reference())


def test_seq_lens_zero_one_and_below_q_len(rng):
    # seq_len 0: nothing attended (out 0, lse -inf); seq_len 1; seq_len < q_len: token positions
    # below 0 attend nothing.
    case = make_case(rng, batch=4, q_len=3, seq_lens=[0, 1, 2, 9])
    out, lse = run_case(case)
    ref_out, ref_lse = case.reference()
    check(out, lse, ref_out, ref_lse)
    assert (np.asarray(out[0]) == 0).all() and np.isneginf(lse[0]).all()
    assert np.isneginf(lse[1, :2]).all() and np.isneginf(lse[2, 0]).all()


def test_causal_q_len_gt_1(rng):
    case = make_case(rng, batch=2, q_len=5, seq_lens=[5, 12])
    out, lse = run_case(case)
    check(out, lse, *case.reference())
    # Token 0 of request 0 sees exactly key 0: its output is that key's value row.
    key0 = case.kv_cache[case.block_tables[0, 0], 0, : case.kv_lora_rank]
    assert_out_close(out[0, 0, 0], key0.astype(np.float64))


@pytest.mark.parametrize("max_q_len", [None, 4])
def test_ragged(rng, max_q_len):
    case = make_case(rng, ragged_q_lens=[1, 3, 0, 4, 2], seq_lens=[6, 3, 5, 4, 20])
    out, lse = run_case(case, max_q_len=max_q_len)
    check(out, lse, *case.reference())


@pytest.mark.parametrize("layout", ["uint32", "uint16"])
def test_custom_mask(rng, layout):
    case = make_case(rng, batch=3, q_len=5, seq_lens=[5, 9, 33])
    mask = random_mask(rng, 3 * 5, 5).reshape(3, 5, -1)
    given = mask if layout == "uint32" else mask.view(np.uint16)
    out, lse = run_case(case, mask=given)
    check(out, lse, *case.reference(mask=mask))


def test_custom_mask_ragged_wide(rng):
    # 40 query tokens need two uint32 words per row.
    case = make_case(rng, ragged_q_lens=[40, 2], seq_lens=[45, 2], page_size=8)
    mask = random_mask(rng, 42, 40)
    out, lse = run_case(case, mask=mask, max_q_len=40)
    check(out, lse, *case.reference(mask=mask))


def test_sinks(rng):
    case = make_case(rng, batch=3, q_len=2, heads=4, seq_lens=[0, 3, 17])
    sinks = (rng.standard_normal(4) * 2).astype(np.float32)
    out, lse = run_case(case, sinks=sinks)
    ref_out, ref_lse = case.reference(sinks=sinks)
    check(out, lse, ref_out, ref_lse)
    # lse excludes the sink; out changes with it.
    _, plain_lse = case.reference()
    np.testing.assert_allclose(ref_lse, plain_lse)


def test_sinks_in_float16(rng):
    # (NumPy cannot export ml_dtypes' bfloat16 through DLPack; bfloat16 sinks are covered by the
    # C++ tests and the PyTorch ones.)
    case = make_case(rng, batch=2, q_len=2, heads=4, seq_lens=[5, 20])
    sinks = (rng.standard_normal(4) * 2).astype(np.float16)
    out, lse = run_case(case, sinks=sinks)
    check(out, lse, *case.reference(sinks=sinks.astype(np.float64)))


@pytest.mark.parametrize("as_array", [False, True])
def test_scales(rng, as_array):
    case = make_case(rng, batch=2, q_len=2)
    bmm1, bmm2 = 0.37, 1.75
    if as_array:
        kw = dict(bmm1_scale=np.array([bmm1], np.float32), bmm2_scale=np.array([bmm2], np.float32))
    else:
        kw = dict(bmm1_scale=bmm1, bmm2_scale=bmm2)
    out, lse = run_case(case, **kw)
    check(out, lse, *case.reference(bmm1_scale=np.float32(bmm1), bmm2_scale=np.float32(bmm2)))


@pytest.mark.parametrize("lens", [None, "per_request", "per_token"])
def test_sparse(rng, lens):
    case = make_case(rng, batch=3, q_len=2, seq_lens=[9, 30, 4])
    top_k = 12
    indices = sparse_case(rng, case, top_k)
    kw = dict(sparse_indices=indices, sparse_top_k=top_k)
    if lens == "per_request":
        kw["sparse_topk_lens"] = np.array([12, 0, 5], np.int32)
    elif lens == "per_token":
        kw["sparse_topk_lens"] = rng.integers(0, top_k + 1, size=(3, 2)).astype(np.int32)
    outputs = case.poisoned_outputs()
    out, lse = mla_decode.batch_decode(
        case.query, case.kv_cache, None, case.seq_lens, **outputs, return_lse=True,
        **case.kwargs(**kw),
    )
    check(out, lse, *case.reference(**kw))


def test_sparse_ragged_per_token_lens(rng):
    case = make_case(rng, ragged_q_lens=[2, 0, 3], seq_lens=[5, 7, 11])
    indices = sparse_case(rng, case, 6)
    lens = np.array([6, 0, 3, 1, 6], np.int32)
    kw = dict(sparse_indices=indices, sparse_top_k=6, sparse_topk_lens=lens)
    outputs = case.poisoned_outputs()
    out, lse = mla_decode.batch_decode(
        case.query, case.kv_cache, None, case.seq_lens, **outputs, return_lse=True,
        **case.kwargs(**kw),
    )
    check(out, lse, *case.reference(**kw))


@pytest.mark.parametrize("lens", [None, "per_request", "per_token"])
def test_sparse_causal_bound_dense_queries(rng, lens):
    # seq_len close to top_k with 4 query tokens: token i counts at most seq_len - 4 + i + 1
    # entries, fewer than top_k for some tokens and not for others; seq_len 2 < q_len leaves
    # tokens 0 and 1 without keys.
    case = make_case(rng, batch=4, q_len=4, seq_lens=[14, 16, 19, 2])
    top_k = 16
    indices = sparse_case(rng, case, top_k, with_missing=False)
    kw = dict(sparse_indices=indices, sparse_top_k=top_k)
    if lens == "per_request":
        kw["sparse_topk_lens"] = np.array([16, 15, 9, 16], np.int32)
    elif lens == "per_token":
        kw["sparse_topk_lens"] = rng.integers(10, top_k + 1, size=(4, 4)).astype(np.int32)
    outputs = case.poisoned_outputs()
    out, lse = mla_decode.batch_decode(
        case.query, case.kv_cache, None, case.seq_lens, **outputs, return_lse=True,
        **case.kwargs(**kw),
    )
    ref_out, ref_lse = case.reference(**kw)
    check(out, lse, ref_out, ref_lse)
    assert np.isneginf(lse[3, :2]).all() and np.isfinite(lse[3, 2:]).all()
    if lens is None:  # the bound binds here: with long sequences token 0 would count all 16
        far = dataclasses.replace(case, seq_lens=np.full(4, 100, np.int32))
        assert not np.allclose(far.reference(**kw)[1][0, 0], ref_lse[0, 0])


def test_sparse_causal_bound_ragged_queries(rng):
    case = make_case(rng, ragged_q_lens=[3, 1, 4, 2], seq_lens=[9, 8, 10, 1])
    top_k = 8
    indices = sparse_case(rng, case, top_k)
    for lens in (None, np.array([8, 7, 8, 8, 2, 8, 8, 8, 8, 8], np.int32)):
        kw = dict(sparse_indices=indices, sparse_top_k=top_k, sparse_topk_lens=lens)
        outputs = case.poisoned_outputs()
        out, lse = mla_decode.batch_decode(
            case.query, case.kv_cache, None, case.seq_lens, **outputs, return_lse=True,
            **case.kwargs(**kw),
        )
        check(out, lse, *case.reference(**kw))
        assert np.isneginf(lse[8]).all()  # request 3: seq_len 1, 2 tokens; token 0 counts none


def test_skip_softmax_tiny_factor_equals_dense(rng):
    # Sequences spanning several 64-key blocks; f = 1e-30 may drop nothing.
    case = make_case(rng, batch=2, q_len=2, page_size=16, seq_lens=[200, 130])
    dense_out, dense_lse = run_case(case)
    out, lse = run_case(case, skip_softmax_threshold_scale_factor=1e-30)
    check(out, lse, *case.reference())
    np.testing.assert_array_equal(out, dense_out)
    np.testing.assert_array_equal(lse, dense_lse)


def test_lse_optional_and_returned(rng):
    case = make_case(rng, batch=2)
    ref_out, ref_lse = case.reference()
    out = mla_decode.batch_decode(*case.args(), **case.kwargs())
    assert not isinstance(out, tuple)
    check(out, None, ref_out, ref_lse)
    out, lse = mla_decode.batch_decode(*case.args(), return_lse=True, **case.kwargs())
    assert lse.dtype == np.float32 and lse.shape == case.query.shape[:-1]
    check(out, lse, ref_out, ref_lse)


def test_default_out_dtype_for_numpy_is_float16(rng):
    case = make_case(rng, batch=1)
    out = mla_decode.batch_decode(*case.args(), **case.kwargs())
    assert out.dtype == np.float16 and out.shape == case.query.shape[:-1] + (case.kv_lora_rank,)


def test_bfloat16_out_via_ml_dtypes(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    case = make_case(rng, batch=2, q_len=2)
    out = np.full(case.query.shape[:-1] + (case.kv_lora_rank,), np.nan, dtype=ml_dtypes.bfloat16)
    mla_decode.batch_decode(*case.args(), out=out, **case.kwargs())
    check(out, None, *case.reference())


@pytest.mark.parametrize(
    "q_dtype,kv_dtype",
    [("bfloat16", "bfloat16"), ("float16", "float16"), ("float8_e4m3fn", "float8_e4m3fn"),
     ("bfloat16", "float8_e4m3fn")],
)
def test_spec_dtype_pairs_via_ml_dtypes(rng, q_dtype, kv_dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    to = lambda name: np.float16 if name == "float16" else getattr(ml_dtypes, name)  # noqa: E731
    case = make_case(rng, batch=2, q_len=2, seq_lens=[3, 21])
    case.query = case.query.astype(to(q_dtype))
    case.kv_cache = case.kv_cache.astype(to(kv_dtype))
    out = mla_decode.batch_decode(*case.args(), **case.kwargs())
    # Default out: the query's dtype when 16-bit, else bfloat16 (ml_dtypes) / float16 (NumPy).
    expected_out = q_dtype if q_dtype in ("bfloat16", "float16") else "float16"
    assert out.dtype.name == expected_out
    # The reference decodes the same low-precision inputs to float64, so only rounding of the
    # 16-bit output and fp32 accumulation remain.
    check(out, None, *case.reference())


def test_batch_zero():
    q = np.zeros((0, 1, 4, 48), np.float32)
    kv = np.zeros((1, 4, 48), np.float32)
    bt = np.zeros((0, 1), np.int32)
    sl = np.zeros((0,), np.int32)
    out, lse = mla_decode.batch_decode(q, kv, bt, sl, kv_lora_rank=32, qk_rope_head_dim=16,
                                       return_lse=True)
    assert out.shape == (0, 1, 4, 32) and lse.shape == (0, 1, 4)
    # Dense q_len 0: T = 0 tokens of B = 2 requests (docs/contract.md section 3), with a mask.
    out, lse = mla_decode.batch_decode(
        np.zeros((2, 0, 4, 48), np.float32), kv, np.zeros((2, 1), np.int32),
        np.array([3, 0], np.int32), kv_lora_rank=32, qk_rope_head_dim=16,
        mask=np.zeros((2, 0, 1), np.uint32), return_lse=True,
    )
    assert out.shape == (2, 0, 4, 32) and lse.shape == (2, 0, 4)
    # Ragged with T = 0 tokens, without a max_q_len hint and with the true bound 0.
    for max_q_len in (None, 0):
        out = mla_decode.batch_decode(
            np.zeros((0, 4, 48), np.float32), kv, np.zeros((2, 1), np.int32), np.zeros(2, np.int32),
            kv_lora_rank=32, qk_rope_head_dim=16, cum_seq_lens_q=np.zeros(3, np.int32),
            max_q_len=max_q_len,
        )
        assert out.shape == (0, 4, 32)


def test_strided_inputs(rng):
    case = make_case(rng, batch=3, q_len=2, page_size=4)
    D = case.query.shape[-1]
    # Query a slice of a wider batch; KV pages padded (page stride larger than page_size * D);
    # block tables a column slice.
    wide_q = np.full((6,) + case.query.shape[1:], np.nan, np.float32)
    wide_q[::2] = case.query
    padded_kv = np.full((case.kv_cache.shape[0], 6, D + 8), np.nan, np.float32)
    padded_kv[:, :4, :D] = case.kv_cache
    wide_bt = np.full((3, 2 * case.block_tables.shape[1]), -5, np.int32)
    wide_bt[:, ::2] = case.block_tables
    strided = (wide_q[::2], padded_kv[:, :4, :D], None, case.seq_lens)
    assert not strided[0].flags.c_contiguous and not strided[1].flags.c_contiguous
    outputs = case.poisoned_outputs()
    with pytest.raises(ValueError, match="^block_tables"):  # last dim must be contiguous
        mla_decode.batch_decode(strided[0], strided[1], wide_bt[:, ::2], case.seq_lens,
                                **case.kwargs())
    bt_rows = np.full((6, case.block_tables.shape[1]), -5, np.int32)
    bt_rows[::2] = case.block_tables
    out, lse = mla_decode.batch_decode(strided[0], strided[1], bt_rows[::2], case.seq_lens,
                                       **outputs, return_lse=True, **case.kwargs())
    check(out, lse, *case.reference())


def test_plan_once_run_every_layer(rng):
    case = make_case(rng, batch=3, q_len=2, seq_lens=[4, 0, 19])
    plan = mla_decode.plan(*case.args(), **case.kwargs())
    assert isinstance(plan, mla_decode.Plan)
    for layer in range(3):
        layer_case = make_case(rng, batch=3, q_len=2, seq_lens=[4, 0, 19])
        layer_case.block_tables = case.block_tables  # the step's paging, shared by all layers
        # Same paging: write this layer's values into the step's pages.
        pool = np.full_like(case.kv_cache, np.nan)
        page_size = pool.shape[-2]
        for b, s in enumerate(case.seq_lens):
            for j in range(int(s)):
                page = case.block_tables[b, j // page_size]
                pool[page, j % page_size] = rng.standard_normal(pool.shape[-1])
        layer_case.kv_cache = pool
        sinks = rng.standard_normal(case.num_heads).astype(np.float32)
        outputs = layer_case.poisoned_outputs()
        if layer % 2:
            out, lse = plan.run(layer_case.query, pool, **outputs, return_lse=True, sinks=sinks,
                                bmm2_scale=0.5)
            ref = layer_case.reference(sinks=sinks, bmm2_scale=0.5)
        else:
            out, lse = mla_decode.run(plan, layer_case.query, pool, **outputs, return_lse=True)
            ref = layer_case.reference()
        check(out, lse, *ref)


def test_plan_rejects_other_shapes_and_fixed_arguments(rng):
    case = make_case(rng, batch=3)
    plan = mla_decode.plan(*case.args(), **case.kwargs())
    other = make_case(rng, batch=3, q_len=2)
    with pytest.raises(ValueError, match="^plan"):
        plan.run(other.query, case.kv_cache)
    with pytest.raises(TypeError, match="^seq_lens"):
        plan.run(case.query, case.kv_cache, seq_lens=case.seq_lens)
    with pytest.raises(TypeError, match="^plan"):
        mla_decode.run("not a plan", case.query, case.kv_cache)


def test_workspace_helpers_and_reuse(rng):
    case = make_case(rng, batch=3, q_len=2)
    size = mla_decode.workspace_size(*case.args(), **case.kwargs())
    assert isinstance(size, int) and size >= 0
    ws = mla_decode.make_workspace(*case.args(), **case.kwargs())
    assert ws.dtype == np.uint8 and ws.shape == (size,)
    big = mla_decode.make_workspace(*case.args(), min_bytes=size + 1000, **case.kwargs())
    assert big.shape == (size + 1000,)
    big[:] = 0xFF  # no zero-filling required, and reusable across calls
    for _ in range(2):
        out, lse = mla_decode.batch_decode(*case.args(), workspace=big, return_lse=True,
                                           **case.kwargs())
        check(out, lse, *case.reference())


def test_validate_indices_and_explicit_cpu_backend(rng):
    case = make_case(rng, batch=2)
    out, lse = run_case(case, validate_indices=True, backend="cpu", enable_pdl=True, stream=0)
    check(out, lse, *case.reference())


def test_available_backends():
    backends = mla_decode.available_backends()
    assert "cpu" in backends and set(backends) <= {"cpu", "sm90"}


def test_separate_kv_page_tables(rng):
    # [B, 2, max_pages] (FlashInfer's uses_shared_paged_kv_idx=False): row 1 names the same pages
    # as row 0 where the requests need them; the result equals the [B, max_pages] table's.
    case = make_case(rng, batch=3, q_len=2, page_size=4, seq_lens=[9, 2, 13])
    expected = run_case(case)
    tables = np.stack([case.block_tables, case.block_tables], axis=1)
    tables[1, 1, 1:] = -4  # request 1 needs page 0 only
    outputs = case.poisoned_outputs()
    out, lse = mla_decode.batch_decode(case.query, case.kv_cache, tables, case.seq_lens,
                                       **outputs, return_lse=True, **case.kwargs())
    np.testing.assert_array_equal(out, expected[0])
    np.testing.assert_array_equal(lse, expected[1])
    tables[2, 1, 2] = tables[2, 0, 1]  # request 2 needs pages 0..3: row 1 differs on page 2
    with pytest.raises(ValueError, match=r"^block_tables\[2\]\[1\]\[2\]: page id .* differs from "
                       r"block_tables\[2\]\[0\]\[2\]"):
        mla_decode.batch_decode(case.query, case.kv_cache, tables, case.seq_lens, **case.kwargs())


# ---- The fp8_ds_mla cache (docs/contract.md, section 1): bfloat16 query, uint8 [P, page_size, 656] ----


def ds_mla_case(rng, **kw):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    case = make_case(rng, kv_lora_rank=512, rope_dim=64, **kw)
    case.query = case.query.astype(ml_dtypes.bfloat16)
    case.kv_cache = fp8_ds_mla_cache(case.kv_cache)
    return case


@pytest.mark.parametrize("kv_4d", [False, True])
def test_fp8_ds_mla_dense(rng, kv_4d):
    case = ds_mla_case(rng, batch=3, q_len=2, heads=16, page_size=16, seq_lens=[40, 1, 17])
    if kv_4d:
        case.kv_cache = case.kv_cache[:, None]
    out, lse = mla_decode.batch_decode(*case.args(), return_lse=True, **case.kwargs())
    assert out.dtype.name == "bfloat16"
    check(out, lse, *case.reference())


def test_fp8_ds_mla_ragged_with_mask_and_sinks(rng):
    case = ds_mla_case(rng, ragged_q_lens=[3, 0, 2], heads=4, page_size=8, seq_lens=[20, 5, 2])
    mask = random_mask(rng, 5, 3)
    sinks = rng.standard_normal(4).astype(np.float32)
    out, lse = mla_decode.batch_decode(*case.args(), return_lse=True,
                                       **case.kwargs(mask=mask, sinks=sinks))
    check(out, lse, *case.reference(mask=mask, sinks=sinks))


def test_fp8_ds_mla_sparse(rng):
    case = ds_mla_case(rng, batch=2, q_len=2, heads=16, page_size=64, seq_lens=[70, 30])
    top_k = 32
    indices = sparse_case(rng, case, top_k)
    lens = np.array([[32, 20], [7, 32]], np.int32)
    kw = dict(sparse_indices=indices, sparse_top_k=top_k, sparse_topk_lens=lens)
    out, lse = mla_decode.batch_decode(case.query, case.kv_cache, None, case.seq_lens,
                                       return_lse=True, **case.kwargs(**kw))
    check(out, lse, *case.reference(**kw))


def test_fp8_ds_mla_reference_decodes_what_was_encoded(rng):
    # The test-side encoder and the reference's decoder agree within float8 rounding.
    from reference import decode_fp8_ds_mla

    x = rng.standard_normal((3, 576)) * np.array([[0.01], [1.0], [300.0]])
    keys = decode_fp8_ds_mla(fp8_ds_mla_cache(x))
    # e4m3 keeps 3 mantissa bits (half an ulp: 1/16 relative); below its normal range the step
    # is 2^-9 of the group's scale amax / 448.
    amax = np.abs(x[:, :512]).reshape(3, 4, 128).max(axis=2).repeat(128, axis=1)
    err = np.abs(keys[:, :512] - x[:, :512])
    assert (err <= np.abs(x[:, :512]) / 16 + amax / 448 / 512).all()
    np.testing.assert_allclose(keys[:, 512:], x[:, 512:], rtol=1 / 128)
    assert np.isnan(decode_fp8_ds_mla(fp8_ds_mla_cache(np.full(576, np.nan)))).all()


# ---- NaN and inf inputs propagate to exactly the rows they touch (docs/contract.md section 1) ----


def run_nan_case(case, **kw):
    """Runs with finite-filled outputs (an unwritten row cannot pass for NaN); returns (out, lse,
    ref_out, ref_lse) after checking that NaN sits exactly where the reference has it."""
    lead = case.query.shape[:-1]
    out = np.full(lead + (case.kv_lora_rank,), 7.0, np.float16)
    lse = np.full(lead, 7.0, np.float32)
    mla_decode.batch_decode(*case.args(), out=out, lse=lse, **case.kwargs(**kw))
    ref_out, ref_lse = case.reference(**kw)
    nan_rows = np.isnan(ref_lse)
    assert (np.isnan(out) == nan_rows[..., None]).all(), "NaN rows of out differ from the reference"
    assert (np.isnan(lse) == nan_rows).all(), "NaN rows of lse differ from the reference"
    assert_out_close(out[~nan_rows], ref_out[~nan_rows])
    assert_lse_close(lse[~nan_rows], ref_lse[~nan_rows])
    return nan_rows


def test_nan_in_one_query_row(rng):
    case = make_case(rng, batch=3, q_len=2, heads=4, seq_lens=[10, 3, 0])
    case.query[1, 0, 2, 7] = np.nan
    case.query[2, 1, 0, 0] = np.nan  # request 2 has no keys: its rows stay empty
    nan_rows = run_nan_case(case)
    assert nan_rows.sum() == 1 and nan_rows[1, 0, 2]


def test_inf_in_a_query_row(rng):
    case = make_case(rng, batch=2, q_len=1, heads=4, seq_lens=[10, 3])
    case.query[0, 0, 3, 40] = -np.inf
    assert run_nan_case(case).sum() == 1


def test_nan_in_an_attended_key(rng):
    # Request 0 (seq_len 10, 2 tokens): its last key is seen by token 1 only, its key 2 by both.
    case = make_case(rng, batch=2, q_len=2, heads=4, page_size=4, seq_lens=[10, 6])
    pool = case.kv_cache
    pool[case.block_tables[0, 9 // 4], 9 % 4, 5] = np.nan
    nan_rows = run_nan_case(case)
    assert nan_rows[0, 1].all() and not nan_rows[0, 0].any() and not nan_rows[1].any()
    pool[case.block_tables[0, 0], 2, 40] = np.inf
    nan_rows = run_nan_case(case)
    assert nan_rows[0].all() and not nan_rows[1].any()


def test_nan_in_keys_that_are_not_attended(rng):
    # A mask hides request 0's last key from both tokens; sparse lists skip entries past their
    # count. Neither NaN row may leak.
    case = make_case(rng, batch=2, q_len=2, heads=4, page_size=4, seq_lens=[10, 6])
    case.kv_cache[case.block_tables[0, 9 // 4], 9 % 4, :] = np.nan
    mask = np.full((2, 2, 1), 0b01, np.uint32)
    assert not run_nan_case(case, mask=mask).any()
    indices = sparse_case(rng, case, 4, with_missing=False)
    nan_slot = int(case.block_tables[0, 2]) * 4 + 1
    indices[indices == nan_slot] = int(case.block_tables[0, 0]) * 4
    indices[0, 0, 3] = nan_slot
    kw = dict(sparse_indices=indices, sparse_top_k=4, sparse_topk_lens=np.array([3, 4], np.int32))
    case.block_tables = None
    assert not run_nan_case(case, **kw).any()
    indices[0, 0, 0] = nan_slot  # now counted: request 0's token 0 is NaN
    assert run_nan_case(case, **kw)[0, 0].all()


@pytest.mark.parametrize("name", ["bmm1_scale", "bmm2_scale"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("as_array", [False, True])
def test_non_finite_scales(rng, name, value, as_array):
    case = make_case(rng, batch=3, q_len=2, heads=4, seq_lens=[10, 3, 0])
    scale = np.array([value], np.float32) if as_array else float(value)
    nan_rows = run_nan_case(case, **{name: scale})
    assert nan_rows[:2].all() and not nan_rows[2].any()  # request 2 has no keys
