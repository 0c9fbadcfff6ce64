"""batch_decode and plan/run through the cpu backend (NumPy inputs) against the float64 reference.

Every SPEC.md feature: dense and ragged queries, causal q_len > 1, custom masks (uint32 and uint16),
sinks, scales as floats and 1-element arrays, sparse top-k with and without lens, skip-softmax,
lse, empty sequences, B = 0. Outputs are NaN-poisoned before each call and the KV pool holds NaN
wherever a read would be wrong (cases.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import mla_decode
from cases import make_case, random_mask, sparse_case

# float16 out from fp32 accumulation (values of magnitude ~1): half an ulp plus accumulation error.
OUT_TOL = dict(rtol=2e-3, atol=2e-3)
LSE_TOL = dict(rtol=1e-5, atol=1e-4)


def check(out, lse, ref_out, ref_lse, out_tol=OUT_TOL, lse_tol=LSE_TOL):
    out = np.asarray(out).astype(np.float64)
    assert out.shape == ref_out.shape
    assert not np.isnan(out).any(), "out holds NaN (unwritten or poisoned read)"
    np.testing.assert_allclose(out, ref_out, **out_tol)
    if lse is not None:
        lse = np.asarray(lse).astype(np.float64)
        assert lse.shape == ref_lse.shape
        assert not np.isnan(lse).any(), "lse holds NaN"
        np.testing.assert_allclose(lse, ref_lse, **lse_tol)


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
    np.testing.assert_allclose(
        out[0, 0, 0].astype(np.float64),
        case.kv_cache[case.block_tables[0, 0], 0, : case.kv_lora_rank].astype(np.float64),
        **OUT_TOL,
    )


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
    check(out, None, *case.reference(), out_tol=dict(rtol=1e-2, atol=1e-2))


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
    check(out, None, *case.reference(), out_tol=dict(rtol=1e-2, atol=1e-2))


def test_batch_zero():
    q = np.zeros((0, 1, 4, 48), np.float32)
    kv = np.zeros((1, 4, 48), np.float32)
    bt = np.zeros((0, 1), np.int32)
    sl = np.zeros((0,), np.int32)
    out, lse = mla_decode.batch_decode(q, kv, bt, sl, kv_lora_rank=32, qk_rope_head_dim=16,
                                       return_lse=True)
    assert out.shape == (0, 1, 4, 32) and lse.shape == (0, 1, 4)
    # Dense q_len 0: T = 0 tokens of B = 2 requests (SPEC.md section 3), with a mask.
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
