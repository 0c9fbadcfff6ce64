"""FlashInfer's behaviour of trtllm_batch_decode_with_kv_cache_mla, checked on the cpu backend with
NumPy inputs against the float64 oracle (reference.py): the signature (names, positional order,
defaults of flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla), argument handling, layouts (lse
[B * q_len, H], kv_cache 3-D/4-D, block tables 2-D/3-D, the packed fp8_ds_mla cache), the refusals,
the defaults (bfloat16 out for every query dtype) and the base of lse (natural log).

Some tests need library support that the cpu backend gained with separate K/V page tables,
bfloat16/float16 sinks and the fp8_ds_mla cache; each says so in its docstring.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

import mla_decode
from cases import make_case, sparse_case
from mla_decode import _arrays
from mla_decode import trtllm_batch_decode_with_kv_cache_mla as fi_decode
from tolerance import assert_lse_close, assert_out_close

ml_dtypes = pytest.importorskip("ml_dtypes")  # bfloat16 and float8_e4m3fn NumPy arrays
BF16, FP8 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn

EMPTY = inspect.Parameter.empty

# FlashInfer's public signature, from its documentation of
# flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla: every parameter is positional-or-keyword,
# in this order, with these defaults.
FLASHINFER_SIGNATURE = [
    ("query", EMPTY),
    ("kv_cache", EMPTY),
    ("workspace_buffer", EMPTY),
    ("qk_nope_head_dim", EMPTY),
    ("kv_lora_rank", EMPTY),
    ("qk_rope_head_dim", EMPTY),
    ("block_tables", EMPTY),
    ("seq_lens", EMPTY),
    ("max_seq_len", EMPTY),
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
    ("cute_dsl_impl", "auto"),
    ("kv_scale_format", "auto"),
    ("cum_seq_lens_q", None),
    ("max_q_len", None),
    ("multi_ctas_kv_counter_buffer", None),
    ("sparse_mla_top_k_lens", None),
    ("enable_dcp", False),
    ("cp_world", 1),
    ("cp_rank", 0),
    ("causal_seqlens_kv_global", None),
    ("use_fp16_softmax", None),
]

# The cpu backend's results against the reference: tolerance.py's error model. The GPU cases at the
# end (PyTorch on a CUDA device) keep these fixed bounds: bfloat16 out (8 significant bits) from
# fp32 accumulation, values of magnitude ~1.
OUT_TOL = dict(rtol=1e-2, atol=1e-2)
LSE_TOL = dict(rtol=1e-5, atol=1e-4)


def workspace_buffer(size=16 << 20):
    return np.full(size, -1, np.int8)  # FlashInfer callers pass int8 buffers; never zeroed here


def fi_args(case, block_tables=None, kv_cache=None, seq_lens="case"):
    """The nine required arguments, positionally, as FlashInfer's callers pass them."""
    tables = case.block_tables if block_tables is None else block_tables
    kv = case.kv_cache if kv_cache is None else kv_cache
    lens = case.seq_lens if isinstance(seq_lens, str) else seq_lens
    max_seq_len = case.block_tables.shape[-1] * case.kv_cache.shape[-2]
    return (case.query, kv, workspace_buffer(), 128, case.kv_lora_rank, case.qk_rope_head_dim,
            tables, lens, max_seq_len)


def scale_of(case):
    return dict(bmm1_scale=case.extra["bmm1_scale"])


def check(got, want, tol):
    got = np.asarray(got).astype(np.float64)
    assert got.shape == want.shape
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, **tol)


# --- Signature -----------------------------------------------------------------------------------


def test_signature_names_order_and_defaults():
    params = list(inspect.signature(fi_decode).parameters.values())
    positional = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.default) for p in positional] == FLASHINFER_SIGNATURE
    extra = params[len(positional):]
    assert [p.name for p in extra] == ["stream"]  # ours, after FlashInfer's, keyword-only
    assert all(p.kind == p.KEYWORD_ONLY and p.default is None for p in extra)


def test_every_parameter_can_be_passed_positionally(rng):
    """FlashInfer's 32 parameters in order, sparse_mla_top_k_lens among them (the 27th)."""
    case = make_case(rng, batch=2, q_len=2, seq_lens=[12, 15])
    indices = sparse_case(rng, case, 4)
    lens = np.array([4, 1, 3, 2], np.int32)
    args = list(fi_args(case, block_tables=indices))
    args += [4, None, case.extra["bmm1_scale"], 1.0, None, None, None, "auto", True, True, None,
             False, "auto", "auto", None, None, None, lens, False, 1, 0, None, None]
    assert len(args) == len(FLASHINFER_SIGNATURE)
    out = fi_decode(*args)
    kw = dict(zip([name for name, _ in FLASHINFER_SIGNATURE], args))
    assert np.array_equal(out, fi_decode(**kw))
    ref_out, _ = case.reference(sparse_indices=indices, sparse_topk_lens=lens.reshape(2, 2))
    assert_out_close(out, ref_out)


# --- Defaults ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "q_dtype,kv_dtype",
    [("float16", "float16"), ("bfloat16", "bfloat16"), ("float8_e4m3fn", "float8_e4m3fn"),
     ("bfloat16", "float8_e4m3fn"), ("float32", "float32")],
)
def test_default_out_is_bfloat16_for_every_query_dtype(rng, q_dtype, kv_dtype):
    to = dict(float16=np.float16, bfloat16=BF16, float8_e4m3fn=FP8, float32=np.float32)
    case = make_case(rng, batch=2, q_len=2, seq_lens=[3, 17])
    case.query = case.query.astype(to[q_dtype])
    case.kv_cache = case.kv_cache.astype(to[kv_dtype])
    out = fi_decode(*fi_args(case), **scale_of(case))
    assert out.dtype == BF16
    assert_out_close(out, case.reference()[0])


def test_native_batch_decode_keeps_the_contract_default(rng):
    """The contract's rule stays with batch_decode: a float16 query gives a float16 out there."""
    case = make_case(rng, batch=2, dtype=np.float16)
    assert mla_decode.batch_decode(*case.args(), **case.kwargs()).dtype == np.float16
    assert fi_decode(*fi_args(case), **scale_of(case)).dtype == BF16


def test_float16_out_given_is_written(rng):
    case = make_case(rng, batch=2, dtype=np.float16)
    out = np.full(case.query.shape[:-1] + (case.kv_lora_rank,), np.nan, np.float16)
    assert fi_decode(*fi_args(case), out=out, **scale_of(case)) is out
    assert_out_close(out, case.reference()[0])


def test_default_scales_are_one(rng):
    case = make_case(rng, batch=2)
    assert_out_close(fi_decode(*fi_args(case)), case.reference(bmm1_scale=1.0)[0])


# --- lse: base and layouts -----------------------------------------------------------------------


def test_lse_is_natural_log(rng):
    case = make_case(rng, batch=3, q_len=2, seq_lens=[5, 9, 30])
    _, lse = fi_decode(*fi_args(case), return_lse=True, **scale_of(case))
    ref_lse = case.reference()[1].reshape(6, -1)
    assert_lse_close(lse, ref_lse)
    # Not base 2 (trtllm-gen's): log2(sum) = ln(sum) / ln 2 differs by far more than the tolerance.
    assert np.abs(ref_lse / math.log(2) - ref_lse).min() > 0.1
    # And sinks are not in it.
    sinks = np.full(case.num_heads, 3.0, np.float32)
    _, lse_sinks = fi_decode(*fi_args(case), return_lse=True, sinks=[sinks], **scale_of(case))
    np.testing.assert_array_equal(lse_sinks, lse)


def test_lse_of_a_query_without_keys_is_minus_infinity(rng):
    case = make_case(rng, batch=2, seq_lens=[0, 6])
    out, lse = fi_decode(*fi_args(case), return_lse=True, **scale_of(case))
    assert np.all(np.isneginf(lse[0])) and np.all(np.asarray(out[0], np.float64) == 0)


def test_lse_layouts(rng):
    case = make_case(rng, batch=2, q_len=3)
    ref_lse = case.reference()[1]
    _, allocated = fi_decode(*fi_args(case), return_lse=True, **scale_of(case))
    assert allocated.shape == (6, case.num_heads) and allocated.dtype == np.float32
    for shape in [(6, case.num_heads), (2, 3, case.num_heads)]:
        given = np.full(shape, np.nan, np.float32)
        _, lse = fi_decode(*fi_args(case), lse=given, return_lse=True, **scale_of(case))
        assert lse is given
        assert_lse_close(lse, ref_lse.reshape(shape))


def test_lse_layout_ragged(rng):
    case = make_case(rng, ragged_q_lens=[1, 3], seq_lens=[4, 8])
    _, lse = fi_decode(*fi_args(case), return_lse=True, cum_seq_lens_q=case.cum_seq_lens_q,
                       **scale_of(case))
    assert lse.shape == (4, case.num_heads)
    assert_lse_close(lse, case.reference()[1])


def test_lse_is_ignored_without_return_lse(rng):
    """As FlashInfer: a given lse is neither validated nor written unless return_lse is set."""
    case = make_case(rng, batch=2, q_len=2)
    for given in (np.full((4, case.num_heads), np.nan, np.float32), np.zeros(3, np.int64)):
        out = fi_decode(*fi_args(case), lse=given, **scale_of(case))
        assert not isinstance(out, tuple)
        assert given.dtype == np.int64 or np.isnan(given).all()


def test_lse_strided_is_written_in_place(rng):
    case = make_case(rng, batch=2, q_len=2)
    lse = np.full((case.num_heads, 4), np.nan, np.float32).T  # [B * q_len, H], column-major
    _, got = fi_decode(*fi_args(case), lse=lse, return_lse=True, **scale_of(case))
    assert got is lse
    assert_lse_close(lse, case.reference()[1].reshape(4, -1))


# --- kv_cache and block table layouts -------------------------------------------------------------


@pytest.mark.parametrize("kv_4d", [False, True])
def test_kv_cache_3d_and_4d(rng, kv_4d):
    case = make_case(rng, batch=3, q_len=2, kv_4d=kv_4d)
    out, lse = fi_decode(*fi_args(case), return_lse=True, **scale_of(case))
    ref_out, ref_lse = case.reference()
    assert_out_close(out, ref_out)
    assert_lse_close(lse, ref_lse.reshape(6, -1))


def test_separate_kv_page_tables(rng):
    """uses_shared_paged_kv_idx=False: [B, 2, max_pages], row 0 K and row 1 V (equal for MLA).
    Needs the library's [B, 2, max_pages] block tables."""
    case = make_case(rng, batch=3, q_len=2, seq_lens=[3, 17, 40])
    tables = np.stack([case.block_tables, case.block_tables], axis=1)
    out, lse = fi_decode(*fi_args(case, block_tables=tables), uses_shared_paged_kv_idx=False,
                         return_lse=True, **scale_of(case))
    ref_out, ref_lse = case.reference()
    assert_out_close(out, ref_out)
    assert_lse_close(lse, ref_lse.reshape(6, -1))


def test_separate_kv_page_tables_must_agree(rng):
    """Row 1 naming other pages than row 0 is an error (the cpu backend checks every entry).
    Needs the library's [B, 2, max_pages] block tables."""
    case = make_case(rng, batch=2, seq_lens=[5, 9], spare_pages=3)
    tables = np.stack([case.block_tables, case.block_tables], axis=1)
    tables[1, 1, 0] = (tables[1, 0, 0] + 1) % case.kv_cache.shape[0]
    with pytest.raises(ValueError, match="^block_tables") as error:
        fi_decode(*fi_args(case, block_tables=tables), uses_shared_paged_kv_idx=False)
    assert "rank" not in str(error.value)  # refused for its contents, not its layout


def test_native_batch_decode_takes_separate_kv_page_tables(rng):
    """batch_decode passes a [B, 2, max_pages] table through. Needs the library's support."""
    case = make_case(rng, batch=2, q_len=2)
    tables = np.stack([case.block_tables, case.block_tables], axis=1)
    out = mla_decode.batch_decode(case.query, case.kv_cache, tables, case.seq_lens,
                                  **case.kwargs())
    assert_out_close(out, case.reference()[0])


@pytest.mark.parametrize("shared", [True, False])
def test_page_table_rank_must_match_uses_shared_paged_kv_idx(rng, shared):
    case = make_case(rng, batch=2)
    tables = case.block_tables
    wrong = np.stack([tables, tables], axis=1) if shared else tables
    with pytest.raises(ValueError, match="^block_tables: .*uses_shared_paged_kv_idx"):
        fi_decode(*fi_args(case, block_tables=wrong), uses_shared_paged_kv_idx=shared)
    if not shared:
        three = np.stack([tables, tables, tables], axis=1)
        with pytest.raises(ValueError, match=r"^block_tables: expected \[B, 2, max_pages\]"):
            fi_decode(*fi_args(case, block_tables=three), uses_shared_paged_kv_idx=False)


# --- Sinks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_list", [False, True])
def test_sinks_float32(rng, as_list):
    case = make_case(rng, batch=2, q_len=2)
    sinks = rng.standard_normal(case.num_heads).astype(np.float32)
    out = fi_decode(*fi_args(case), sinks=[sinks] if as_list else sinks, **scale_of(case))
    assert_out_close(out, case.reference(sinks=sinks)[0])


def test_sinks_float16(rng):
    """float16 sinks pass through unconverted. Needs the library's 16-bit sinks."""
    case = make_case(rng, batch=2, q_len=2)
    sinks = (2 * rng.standard_normal(case.num_heads)).astype(np.float16)
    out = fi_decode(*fi_args(case), sinks=[sinks], **scale_of(case))
    assert_out_close(out, case.reference(sinks=sinks)[0])


def test_sinks_numpy_bfloat16_is_refused_clearly(rng):
    """NumPy cannot export ml_dtypes' bfloat16 through DLPack (PyTorch and JAX can)."""
    case = make_case(rng, batch=1)
    sinks = np.zeros(case.num_heads, BF16)
    with pytest.raises(TypeError, match="^sinks: .*bfloat16"):
        fi_decode(*fi_args(case), sinks=sinks)


def test_sinks_list_of_two_is_refused(rng):
    case = make_case(rng, batch=1)
    sinks = np.zeros(case.num_heads, np.float32)
    with pytest.raises(ValueError, match="^sinks"):
        fi_decode(*fi_args(case), sinks=[sinks, sinks])


# --- Sparse ---------------------------------------------------------------------------------------


def test_sparse_top_k_lens_one_per_query_token(rng):
    case = make_case(rng, batch=2, q_len=3, seq_lens=[20, 14])
    indices = sparse_case(rng, case, 8)
    lens = np.array([8, 0, 3, 5, 8, 1], np.int32)
    out = fi_decode(*fi_args(case, block_tables=indices), sparse_mla_top_k=8,
                    sparse_mla_top_k_lens=lens, **scale_of(case))
    ref_out = case.reference(sparse_indices=indices, sparse_topk_lens=lens.reshape(2, 3))[0]
    assert_out_close(out, ref_out)


@pytest.mark.parametrize("shape", [(2,), (2, 3), (7,)])
def test_sparse_top_k_lens_other_layouts_are_refused(rng, shape):
    """FlashInfer's lens are flat, one per query token: [B] (per request) and [B, q_len] are not
    its layout."""
    case = make_case(rng, batch=2, q_len=3, seq_lens=[20, 14])
    indices = sparse_case(rng, case, 4)
    with pytest.raises(ValueError, match=r"^sparse_mla_top_k_lens: expected \[6\]"):
        fi_decode(*fi_args(case, block_tables=indices), sparse_mla_top_k=4,
                  sparse_mla_top_k_lens=np.full(shape, 4, np.int32))


def test_sparse_top_k_lens_in_dense_mode_is_refused(rng):
    case = make_case(rng, batch=2)
    with pytest.raises(ValueError, match="^sparse_mla_top_k_lens"):
        fi_decode(*fi_args(case), sparse_mla_top_k_lens=np.ones(2, np.int32))


def test_sparse_with_separate_page_tables_is_refused(rng):
    case = make_case(rng, batch=2, seq_lens=[9, 9])
    indices = sparse_case(rng, case, 4)
    with pytest.raises(ValueError, match="^uses_shared_paged_kv_idx"):
        fi_decode(*fi_args(case, block_tables=indices), sparse_mla_top_k=4,
                  uses_shared_paged_kv_idx=False)


# --- The packed fp8_ds_mla cache (FlashInfer's sparse v32 path) -----------------------------------


def pack_ds_mla(rng, kv, arbitrary_scales=False):
    """[P, page, 576] float32 rows -> (uint8 [P, page, 656] fp8_ds_mla pool, float64 [P, page, 576]
    of the values it holds): 512 e4m3 values, 4 float32 scales (one per 128 values, multiplied
    in), 64 bfloat16 rope values, little-endian. NaN rows stay NaN."""
    lead = kv.shape[:-1]
    rows = kv.reshape(-1, 576).astype(np.float64)
    n = rows.shape[0]
    if arbitrary_scales:
        scales = rng.uniform(0.01, 0.1, (n, 4))
    else:
        scales = 2.0 ** rng.integers(-6, -2, (n, 4)).astype(np.float64)  # DeepSeek-V3.2's
    scales = scales.astype(np.float32)
    per_value = np.repeat(scales.astype(np.float64), 128, axis=1)
    fp8 = (rows[:, :512] / per_value).astype(FP8)
    rope = rows[:, 512:].astype(BF16)
    packed = np.concatenate(
        [fp8.view(np.uint8), scales.astype("<f4").view(np.uint8), rope.view(np.uint8)], axis=1)
    assert packed.shape == (n, 656)
    values = np.concatenate([fp8.astype(np.float64) * per_value, rope.astype(np.float64)], axis=1)
    return packed.reshape(lead + (656,)), values.reshape(lead + (576,))


def ds_mla_case(rng, batch=2, q_len=2, top_k=8, heads=4, kv_4d=False, arbitrary_scales=False):
    case = make_case(rng, batch=batch, q_len=q_len, heads=heads, kv_lora_rank=512, rope_dim=64,
                     seq_lens=[top_k + 9] * batch)
    indices = sparse_case(rng, case, top_k)
    packed, values = pack_ds_mla(rng, case.kv_cache, arbitrary_scales)
    if kv_4d:
        packed = packed.reshape(packed.shape[0], 1, *packed.shape[1:])
    case.query = case.query.astype(BF16)
    case.kv_cache = values  # what the oracle reads
    return case, packed, indices


def ds_mla_reference(case, indices, top_k, lens=None):
    # Every listed entry is visible on FlashInfer's sparse v32 path: KV lengths past the causal
    # bound's reach for the oracle.
    q_len = case.query.shape[1]
    case.seq_lens = np.full(len(case.seq_lens), top_k + q_len - 1, np.int32)
    return case.reference(sparse_indices=indices, sparse_topk_lens=lens)


@pytest.mark.parametrize("kv_4d", [False, True])
@pytest.mark.parametrize("arbitrary_scales", [False, True])
def test_ds_mla_sparse_without_lengths(rng, kv_4d, arbitrary_scales):
    """seq_lens None: every entry of the indices counts. Needs the library's fp8_ds_mla cache."""
    case, packed, indices = ds_mla_case(rng, kv_4d=kv_4d, arbitrary_scales=arbitrary_scales)
    fmt = "arbitrary_fp32" if arbitrary_scales else "pow2_fp32"
    out, lse = fi_decode(*fi_args(case, block_tables=indices, kv_cache=packed, seq_lens=None),
                         sparse_mla_top_k=8, kv_scale_format=fmt, return_lse=True,
                         **scale_of(case))
    ref_out, ref_lse = ds_mla_reference(case, indices, 8)
    assert_out_close(out, ref_out)
    assert_lse_close(lse, ref_lse.reshape(4, -1))


@pytest.mark.parametrize("layout", ["per_token_2d", "per_token_flat", "per_request_ignored"])
def test_ds_mla_sparse_seq_lens_are_top_k_lengths(rng, layout):
    """FlashInfer's sparse v32 path reads seq_lens as top-k lengths: [B, q_len] or [B * q_len] per
    token; [B] with q_len > 1 is ignored. Needs the library's fp8_ds_mla cache."""
    case, packed, indices = ds_mla_case(rng, batch=2, q_len=3, top_k=8)
    per_token = np.array([[8, 2, 5], [0, 7, 1]], np.int32)
    given = dict(per_token_2d=per_token, per_token_flat=per_token.reshape(-1),
                 per_request_ignored=np.array([1, 1], np.int32))[layout]
    out = fi_decode(*fi_args(case, block_tables=indices, kv_cache=packed, seq_lens=given),
                    sparse_mla_top_k=8, **scale_of(case))
    lens = None if layout == "per_request_ignored" else per_token
    assert_out_close(out, ds_mla_reference(case, indices, 8, lens)[0])


def test_native_batch_decode_takes_the_ds_mla_cache(rng):
    """batch_decode hands a uint8 kv_cache over as uint8 (dense mode). Needs the library's
    fp8_ds_mla cache."""
    case, packed, _ = ds_mla_case(rng, batch=2, q_len=1)
    out = mla_decode.batch_decode(case.query, packed, case.block_tables, case.seq_lens,
                                  **case.kwargs())
    assert_out_close(out, case.reference()[0])


def test_uint8_kv_cache_is_not_reinterpreted():
    packed = np.zeros((2, 4, 656), np.uint8)
    view, code = _arrays.ffi_view(packed)
    assert view is packed and code == -1


def test_ds_mla_cache_needs_sparse_mode(rng):
    case, packed, _ = ds_mla_case(rng)
    with pytest.raises(ValueError, match="^kv_cache: .*sparse_mla_top_k > 0"):
        fi_decode(*fi_args(case, kv_cache=packed))


def test_ds_mla_cache_refusals(rng):
    case, packed, indices = ds_mla_case(rng, batch=2, q_len=2, top_k=8)
    args = fi_args(case, block_tables=indices, kv_cache=packed, seq_lens=None)
    with pytest.raises(ValueError, match="^sparse_mla_top_k_lens"):
        fi_decode(*args, sparse_mla_top_k=8, sparse_mla_top_k_lens=np.ones(4, np.int32))
    with pytest.raises(ValueError, match="^seq_lens"):
        fi_decode(*fi_args(case, block_tables=indices, kv_cache=packed,
                           seq_lens=np.ones(3, np.int32)), sparse_mla_top_k=8)
    with pytest.raises(TypeError, match="^seq_lens"):
        fi_decode(*fi_args(case, block_tables=indices, kv_cache=packed,
                           seq_lens=np.ones(4, np.int64)), sparse_mla_top_k=8)
    ragged = case.query.reshape(4, case.num_heads, 576)
    with pytest.raises(ValueError, match="^query"):
        fi_decode(ragged, *args[1:], sparse_mla_top_k=8,
                  cum_seq_lens_q=np.array([0, 2, 4], np.int32))
    with pytest.raises(ValueError, match="^uses_shared_paged_kv_idx"):
        fi_decode(*args, sparse_mla_top_k=8, uses_shared_paged_kv_idx=False)


# --- Arguments that only pick among FlashInfer's kernels ------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [dict(is_var_seq=False), dict(enable_pdl=None), dict(enable_pdl=False), dict(backend="cpu"),
     dict(backend="auto"), dict(cute_dsl_impl="modular"), dict(cute_dsl_impl="monolithic"),
     dict(kv_scale_format="pow2_fp32"), dict(kv_scale_format="arbitrary_fp32"),
     dict(kv_scale_format="Pow2-FP32"), dict(use_fp16_softmax=False),
     dict(multi_ctas_kv_counter_buffer=np.zeros(4096, np.uint8)),
     dict(skip_softmax_threshold_scale_factor=1e-30), dict(enable_dcp=False, cp_world=1,
                                                          cp_rank=0)],
)
def test_accepted_arguments_without_effect(rng, kw):
    case = make_case(rng, batch=2, q_len=2)
    want = fi_decode(*fi_args(case), **scale_of(case))
    np.testing.assert_array_equal(fi_decode(*fi_args(case), **scale_of(case), **kw), want)


# --- Refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["trtllm-gen", "xqa", "cute-dsl", "sparse"])
def test_flashinfer_blackwell_backends_are_refused(rng, backend):
    case = make_case(rng, batch=1)
    pattern = f"^backend: '{backend}' .*Blackwell.*'auto', 'sm90' .*'cpu'"
    with pytest.raises(ValueError, match=pattern):
        fi_decode(*fi_args(case), backend=backend)


def test_enable_dcp_returns_a_local_state(rng):
    # The full check of the DCP semantics is tests/python/test_context_parallel.py.
    case = make_case(rng, batch=1)
    out, lse = fi_decode(*fi_args(case), return_lse=True, enable_dcp=True, cp_world=1, cp_rank=0,
                         causal_seqlens_kv_global=case.seq_lens)
    assert out.shape[-1] == case.kv_lora_rank and lse.shape == (case.query.shape[1], case.num_heads)


@pytest.mark.parametrize(
    "kw,error,name",
    [(dict(cp_world=2), ValueError, "cp_world"), (dict(cp_rank=1), ValueError, "cp_rank"),
     (dict(causal_seqlens_kv_global=np.ones(1, np.int32)), ValueError, "causal_seqlens_kv_global"),
     (dict(cp_world=0), ValueError, "cp_world"), (dict(cp_rank=0.5), TypeError, "cp_rank"),
     (dict(enable_dcp=1), TypeError, "enable_dcp")],
)
def test_context_parallel_arguments_need_enable_dcp(rng, kw, error, name):
    case = make_case(rng, batch=1)
    with pytest.raises(error, match=f"^{name}: "):
        fi_decode(*fi_args(case), **kw)


@pytest.mark.parametrize(
    "kw,error,name",
    [(dict(use_fp16_softmax=True), ValueError, "use_fp16_softmax"),
     (dict(use_fp16_softmax=1), TypeError, "use_fp16_softmax"),
     (dict(cute_dsl_impl="fast"), ValueError, "cute_dsl_impl"),
     (dict(kv_scale_format="ue8m0"), ValueError, "kv_scale_format"),
     (dict(kv_scale_format=None), ValueError, "kv_scale_format"),
     (dict(multi_ctas_kv_counter_buffer=[0]), TypeError, "multi_ctas_kv_counter_buffer"),
     (dict(max_q_len=2), ValueError, "max_q_len"),
     (dict(sinks="sinks"), TypeError, "sinks")],
)
def test_refused_values_name_the_argument(rng, kw, error, name):
    case = make_case(rng, batch=1)
    with pytest.raises(error, match=f"^{name}: "):
        fi_decode(*fi_args(case), **kw)


def test_seq_lens_none_is_refused_in_dense_mode(rng):
    case = make_case(rng, batch=1)
    with pytest.raises(ValueError, match="^seq_lens: "):
        fi_decode(*fi_args(case, seq_lens=None))


def test_empty_batch(rng):
    case = make_case(rng, batch=1)
    query = np.zeros((0, 1, case.num_heads, case.query.shape[-1]), np.float32)
    out, lse = fi_decode(query, case.kv_cache, workspace_buffer(), 128, case.kv_lora_rank,
                         case.qk_rope_head_dim, np.zeros((0, 2), np.int32),
                         np.zeros(0, np.int32), 4, return_lse=True)
    assert out.shape == (0, 1, case.num_heads, case.kv_lora_rank) and out.dtype == BF16
    assert lse.shape == (0, case.num_heads)


# --- On the GPU: the sm90 backend with PyTorch CUDA tensors (skipped without them) -------------


def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or "sm90" not in mla_decode.available_backends():
        pytest.skip("needs PyTorch with CUDA and the sm90 backend")
    return torch


def to_cuda(torch, x, dtype=None):
    t = torch.from_numpy(np.ascontiguousarray(x))
    return (t if dtype is None else t.to(dtype)).cuda()


def as_f64(t):
    return t.detach().cpu().double().numpy()


def test_gpu_defaults_lse_and_separate_page_tables(rng):
    """float16 query: bfloat16 out; natural-log lse in [B * q_len, H]; [B, 2, max_pages] tables;
    bfloat16 sinks."""
    torch = cuda_torch()
    case = make_case(rng, batch=3, q_len=2, heads=16, kv_lora_rank=512, rope_dim=64,
                     page_size=64, seq_lens=[70, 2, 300])
    query = to_cuda(torch, case.query, torch.float16)
    kv = to_cuda(torch, case.kv_cache, torch.float16)
    tables = to_cuda(torch, np.stack([case.block_tables, case.block_tables], axis=1))
    sinks = torch.randn(16, device="cuda").to(torch.bfloat16)
    ws = torch.empty(128 << 20, dtype=torch.int8, device="cuda")
    out, lse = fi_decode(query, kv, ws, 128, 512, 64, tables, to_cuda(torch, case.seq_lens),
                         case.block_tables.shape[1] * 64, bmm1_scale=case.extra["bmm1_scale"],
                         sinks=[sinks], uses_shared_paged_kv_idx=False, return_lse=True)
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and tuple(lse.shape) == (6, 16)
    case.query, case.kv_cache = as_f64(query), as_f64(kv)
    ref_out, ref_lse = case.reference(sinks=as_f64(sinks))
    check(as_f64(out), ref_out, OUT_TOL)
    check(as_f64(lse), ref_lse.reshape(6, 16), dict(rtol=1e-4, atol=1e-3))


def test_gpu_ds_mla_sparse_in_a_cuda_graph(rng):
    """The packed fp8_ds_mla cache on FlashInfer's sparse path, captured in a CUDA graph (the
    KV lengths made from top_k are written inside the graph) and replayed."""
    torch = cuda_torch()
    case, packed, indices = ds_mla_case(rng, batch=2, q_len=2, top_k=64, heads=16)
    query = to_cuda(torch, case.query.astype(np.float32), torch.bfloat16)
    kv, idx = to_cuda(torch, packed), to_cuda(torch, indices)
    per_token = np.array([64, 17, 1, 40], np.int32)
    lens = to_cuda(torch, per_token)
    ws = torch.empty(128 << 20, dtype=torch.int8, device="cuda")
    out = torch.empty(2, 2, 16, 512, dtype=torch.bfloat16, device="cuda")

    def call():
        fi_decode(query, kv, ws, 512, 512, 64, idx, lens, 0, sparse_mla_top_k=64, out=out,
                  bmm1_scale=case.extra["bmm1_scale"])

    call()  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_out = ds_mla_reference(case, indices, 64, per_token.reshape(2, 2))[0]
    check(as_f64(out), ref_out, OUT_TOL)
