"""PyTorch tensors on the host through the cpu backend: allocation in torch, the float8 view path
(float8_e4m3fn passed as uint8 plus its real type), scale tensors, FlashInfer-style calls.
Skipped when PyTorch is not installed."""

from __future__ import annotations

import numpy as np
import pytest

import mla_decode
from cases import make_case

torch = pytest.importorskip("torch")

TORCH_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
    "float32": torch.float32,
}


def to_torch(case, q_dtype="float32", kv_dtype="float32", device="cpu"):
    """The case's tensors as torch tensors; query/KV cast to the given dtypes (NaN poison kept)."""
    case.query = torch.from_numpy(case.query).to(TORCH_DTYPES[q_dtype]).to(device)
    case.kv_cache = torch.from_numpy(case.kv_cache).to(TORCH_DTYPES[kv_dtype]).to(device)
    case.block_tables = torch.from_numpy(case.block_tables).to(device)
    case.seq_lens = torch.from_numpy(case.seq_lens).to(device)
    if case.cum_seq_lens_q is not None:
        case.cum_seq_lens_q = torch.from_numpy(case.cum_seq_lens_q).to(device)
    return case


def reference_of(case, **kw):
    """The float64 reference from the (already rounded) torch inputs."""
    ref_case = type(case)(**{**case.__dict__})
    for name in ("query", "kv_cache", "block_tables", "seq_lens", "cum_seq_lens_q"):
        t = getattr(case, name)
        if t is not None:
            t = t.cpu()
            setattr(ref_case, name, (t.to(torch.float64) if t.is_floating_point() else t).numpy())
    return ref_case.reference(**kw)


def close(got, want, tol):
    got = got.detach().cpu().to(torch.float64).numpy()
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, **tol)


BF16_TOL = dict(rtol=1e-2, atol=1e-2)


def test_float32_default_out_is_bfloat16(rng):
    case = to_torch(make_case(rng, batch=2, q_len=2))
    out, lse = mla_decode.batch_decode(*case.args(), return_lse=True, **case.kwargs())
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref_out, ref_lse = reference_of(case)
    close(out, ref_out, BF16_TOL)
    close(lse, ref_lse, dict(rtol=1e-5, atol=1e-4))


@pytest.mark.parametrize(
    "q_dtype,kv_dtype",
    [("bfloat16", "bfloat16"), ("float16", "float16"), ("float8_e4m3fn", "float8_e4m3fn"),
     ("bfloat16", "float8_e4m3fn")],
)
def test_spec_dtype_pairs(rng, q_dtype, kv_dtype):
    if TORCH_DTYPES[q_dtype] is None or TORCH_DTYPES[kv_dtype] is None:
        pytest.skip("this PyTorch has no float8_e4m3fn")
    case = to_torch(make_case(rng, batch=2, q_len=2, seq_lens=[2, 19]), q_dtype, kv_dtype)
    out = mla_decode.batch_decode(*case.args(), **case.kwargs())
    assert out.dtype == (TORCH_DTYPES[q_dtype] if q_dtype != "float8_e4m3fn" else torch.bfloat16)
    close(out, reference_of(case)[0], BF16_TOL)


def test_scale_tensors_and_workspace_in_torch(rng):
    case = to_torch(make_case(rng, batch=2))
    ws = mla_decode.make_workspace(*case.args(), **case.kwargs())
    assert isinstance(ws, torch.Tensor) and ws.dtype == torch.uint8 and ws.dim() == 1
    s1 = torch.tensor([0.3], dtype=torch.float32)
    s2 = torch.tensor([1.5], dtype=torch.float32)
    out = mla_decode.batch_decode(*case.args(), workspace=ws,
                                  **case.kwargs(bmm1_scale=s1, bmm2_scale=s2))
    close(out, reference_of(case, bmm1_scale=np.float32(0.3), bmm2_scale=1.5)[0], BF16_TOL)


def test_flashinfer_call_with_torch(rng):
    case = to_torch(make_case(rng, batch=2, q_len=2), "bfloat16", "bfloat16")
    ws = torch.zeros(1 << 20, dtype=torch.int8)
    out, lse = mla_decode.trtllm_batch_decode_with_kv_cache_mla(
        case.query, case.kv_cache, ws, 128, case.kv_lora_rank, case.qk_rope_head_dim,
        case.block_tables, case.seq_lens, int(case.block_tables.shape[1] * 4),
        bmm1_scale=case.extra["bmm1_scale"], return_lse=True,
    )
    assert out.dtype == torch.bfloat16 and tuple(lse.shape) == (4, case.num_heads)
    ref_out, ref_lse = reference_of(case)
    close(out, ref_out, BF16_TOL)
    close(lse, ref_lse.reshape(4, -1), dict(rtol=1e-5, atol=1e-4))


def test_flashinfer_default_out_is_bfloat16_for_a_float16_query(rng):
    case = to_torch(make_case(rng, batch=2, q_len=2), "float16", "float16")
    ws = torch.zeros(1 << 20, dtype=torch.int8)
    out = mla_decode.trtllm_batch_decode_with_kv_cache_mla(
        case.query, case.kv_cache, ws, 128, case.kv_lora_rank, case.qk_rope_head_dim,
        case.block_tables, case.seq_lens, int(case.block_tables.shape[1] * 4),
        bmm1_scale=case.extra["bmm1_scale"],
    )
    assert out.dtype == torch.bfloat16  # FlashInfer's; batch_decode keeps float16 (docs/contract.md)
    assert mla_decode.batch_decode(*case.args(), **case.kwargs()).dtype == torch.float16
    close(out, reference_of(case)[0], BF16_TOL)


def test_flashinfer_lse_given_as_b_qlen_h_is_returned(rng):
    case = to_torch(make_case(rng, batch=2, q_len=2), "bfloat16", "bfloat16")
    lse = torch.full((2, 2, case.num_heads), float("nan"))
    _, got = mla_decode.trtllm_batch_decode_with_kv_cache_mla(
        case.query, case.kv_cache, torch.zeros(1 << 20, dtype=torch.int8), 128,
        case.kv_lora_rank, case.qk_rope_head_dim, case.block_tables, case.seq_lens,
        int(case.block_tables.shape[1] * 4), bmm1_scale=case.extra["bmm1_scale"], lse=lse,
        return_lse=True,
    )
    assert got is lse
    close(lse, reference_of(case)[1], dict(rtol=1e-5, atol=1e-4))


@pytest.mark.parametrize("sinks_dtype", ["bfloat16", "float16"])
def test_sixteen_bit_sinks_pass_through(rng, sinks_dtype):
    """bfloat16/float16 sinks reach the library as they are. Needs the library's 16-bit sinks."""
    case = to_torch(make_case(rng, batch=2, q_len=2), "bfloat16", "bfloat16")
    sinks = torch.randn(case.num_heads).to(TORCH_DTYPES[sinks_dtype])
    out = mla_decode.batch_decode(*case.args(), **case.kwargs(sinks=sinks))
    close(out, reference_of(case, sinks=sinks.to(torch.float64).numpy())[0], BF16_TOL)


def test_uint8_kv_cache_is_passed_as_uint8():
    from mla_decode import _arrays

    packed = torch.zeros(2, 4, 656, dtype=torch.uint8)
    view, code = _arrays.ffi_view(packed)
    assert view is packed and code == -1


def test_fp8_ds_mla_cache_from_torch(rng):
    """A uint8 [P, page_size, 656] cache with a bfloat16 query (dense mode). Needs the library's
    fp8_ds_mla cache."""
    case = make_case(rng, batch=2, q_len=1, heads=4, kv_lora_rank=512, rope_dim=64,
                     seq_lens=[5, 11])
    rows = torch.from_numpy(np.nan_to_num(case.kv_cache)).reshape(-1, 576)
    scales = torch.full((rows.shape[0], 4), 0.25)
    fp8 = (rows[:, :512] / 0.25).to(torch.float8_e4m3fn)
    rope = rows[:, 512:].to(torch.bfloat16)
    packed = torch.cat([fp8.view(torch.uint8), scales.view(torch.uint8), rope.view(torch.uint8)],
                       dim=1).reshape(*case.kv_cache.shape[:-1], 656)
    values = torch.cat([fp8.to(torch.float64) * 0.25, rope.to(torch.float64)], dim=1)
    case.kv_cache = values.reshape(*case.kv_cache.shape).numpy()
    query = torch.from_numpy(case.query).to(torch.bfloat16)
    out = mla_decode.batch_decode(query, packed, torch.from_numpy(case.block_tables),
                                  torch.from_numpy(case.seq_lens), **case.kwargs())
    case.query = query.to(torch.float64).numpy()
    close(out, case.reference()[0], BF16_TOL)
