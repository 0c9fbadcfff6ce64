"""CUDA tests through PyTorch: bf16/fp16/fp8 against the float64 reference, CUDA graph capture and
replay, a non-default stream, plan/run, the FlashInfer-compatible call. Skipped unless PyTorch sees
a compute-capability 9.0 GPU and this build has the sm90 backend (mla_decode.available_backends()).
"""

from __future__ import annotations

import numpy as np
import pytest

import mla_decode
from cases import make_case
from sm90_gpu import require_sm90

torch = require_sm90()

from test_torch import close, reference_of, to_torch  # noqa: E402

# Tolerances per dtype on out (vs float64 over the same rounded inputs) and on lse.
OUT_TOL = {
    "bfloat16": dict(rtol=2e-2, atol=2e-2),
    "float16": dict(rtol=5e-3, atol=5e-3),
    "float8_e4m3fn": dict(rtol=5e-2, atol=5e-2),
}
LSE_TOL = dict(rtol=1e-4, atol=2e-3)


def deepseek_case(rng, *, batch=4, q_len=1, heads=128, seq_lens=None, page_size=64):
    return make_case(rng, batch=batch, q_len=q_len, heads=heads, kv_lora_rank=512, rope_dim=64,
                     page_size=page_size, seq_lens=seq_lens)


def poisoned(case, dtype=torch.bfloat16):
    lead = tuple(case.query.shape[:-1])
    out = torch.full(lead + (case.kv_lora_rank,), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full(lead, float("nan"), dtype=torch.float32, device="cuda")
    return out, lse


@pytest.mark.parametrize(
    "q_dtype,kv_dtype",
    [("bfloat16", "bfloat16"), ("float16", "float16"), ("float8_e4m3fn", "float8_e4m3fn"),
     ("bfloat16", "float8_e4m3fn")],
)
@pytest.mark.parametrize("q_len", [1, 2])
def test_dtypes_against_reference(rng, q_dtype, kv_dtype, q_len):
    case = to_torch(deepseek_case(rng, q_len=q_len, seq_lens=[0, 1, 300, 1000]), q_dtype,
                    kv_dtype, "cuda")
    out_dtype = torch.float16 if q_dtype == "float16" else torch.bfloat16
    out, lse = poisoned(case, out_dtype)
    mla_decode.batch_decode(*case.args(), out=out, lse=lse, **case.kwargs())
    torch.cuda.synchronize()
    ref_out, ref_lse = reference_of(case)
    tol = OUT_TOL["float8_e4m3fn" if "float8_e4m3fn" in (q_dtype, kv_dtype) else q_dtype]
    close(out, ref_out, tol)
    close(lse, ref_lse, LSE_TOL)


def test_default_outputs_on_the_query_device(rng):
    case = to_torch(deepseek_case(rng, batch=2), "float8_e4m3fn", "float8_e4m3fn", "cuda")
    out, lse = mla_decode.batch_decode(*case.args(), return_lse=True, **case.kwargs())
    assert out.is_cuda and out.dtype == torch.bfloat16 and lse.dtype == torch.float32


def test_cuda_graph_capture_and_replay(rng):
    case = to_torch(deepseek_case(rng, batch=4, seq_lens=[64, 200, 700, 1000]), "bfloat16",
                    "bfloat16", "cuda")
    bmm1 = torch.tensor([case.extra["bmm1_scale"]], dtype=torch.float32, device="cuda")
    ws = mla_decode.make_workspace(*case.args(), **case.kwargs(bmm1_scale=bmm1))
    out, lse = poisoned(case)
    kwargs = case.kwargs(bmm1_scale=bmm1)

    def step():
        mla_decode.batch_decode(*case.args(), workspace=ws, out=out, lse=lse, **kwargs)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    # New lengths (within each request's pages) and a new scale, written in place: the replay must
    # pick both up.
    case.seq_lens.copy_(torch.tensor([1, 64, 699, 333], dtype=torch.int32))
    bmm1.fill_(0.5 * case.extra["bmm1_scale"])
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = reference_of(case, bmm1_scale=bmm1.item())
    close(out, ref_out, OUT_TOL["bfloat16"])
    close(lse, ref_lse, LSE_TOL)


def test_runs_on_the_callers_stream(rng):
    case = to_torch(deepseek_case(rng, batch=2, seq_lens=[500, 900]), "bfloat16", "bfloat16",
                    "cuda")
    new_query = torch.randn_like(case.query, dtype=torch.float32).to(torch.bfloat16)
    ws = mla_decode.make_workspace(*case.args(), **case.kwargs())
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    for explicit in (False, True):
        out, _ = poisoned(case)
        with torch.cuda.stream(s):
            # A slow kernel, then the new query, both on s: a launch on any other stream would
            # read the old query.
            torch.cuda._sleep(100_000_000)
            case.query.copy_(new_query)
            if explicit:
                with torch.cuda.stream(torch.cuda.default_stream()):
                    mla_decode.batch_decode(*case.args(), workspace=ws, out=out, stream=s,
                                            **case.kwargs())
            else:
                mla_decode.batch_decode(*case.args(), workspace=ws, out=out, **case.kwargs())
        s.synchronize()
        close(out, reference_of(case)[0], OUT_TOL["bfloat16"])
        new_query = torch.randn_like(new_query, dtype=torch.float32).to(torch.bfloat16)


def test_plan_once_run_layers(rng):
    case = to_torch(deepseek_case(rng, batch=3, q_len=2, seq_lens=[5, 400, 64]), "bfloat16",
                    "bfloat16", "cuda")
    plan = mla_decode.plan(*case.args(), **case.kwargs())
    for _ in range(2):
        case.kv_cache = torch.where(torch.isnan(case.kv_cache), case.kv_cache,
                                    torch.randn_like(case.kv_cache))
        case.query = torch.randn_like(case.query)
        out, lse = plan.run(case.query, case.kv_cache, return_lse=True)
        torch.cuda.synchronize()
        ref_out, ref_lse = reference_of(case)
        close(out, ref_out, OUT_TOL["bfloat16"])
        close(lse, ref_lse, LSE_TOL)


def test_flashinfer_call(rng):
    case = to_torch(deepseek_case(rng, batch=2, q_len=2), "bfloat16", "bfloat16", "cuda")
    ws = torch.zeros(128 << 20, dtype=torch.int8, device="cuda")
    out, lse = mla_decode.trtllm_batch_decode_with_kv_cache_mla(
        case.query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens,
        int(case.block_tables.shape[1] * 64), bmm1_scale=case.extra["bmm1_scale"],
        return_lse=True,
    )
    torch.cuda.synchronize()
    ref_out, ref_lse = reference_of(case)
    close(out, ref_out, OUT_TOL["bfloat16"])
    close(lse, ref_lse.reshape(4, -1), LSE_TOL)


def test_validate_indices_reports_a_bad_page(rng):
    case = to_torch(deepseek_case(rng, batch=2), "bfloat16", "bfloat16", "cuda")
    case.block_tables.fill_(10**6)
    with pytest.raises(ValueError, match="^block_tables"):
        mla_decode.batch_decode(*case.args(), validate_indices=True, **case.kwargs())
        torch.cuda.synchronize()


def test_host_tensor_mixed_with_cuda_is_refused(rng):
    case = to_torch(deepseek_case(rng, batch=2), "bfloat16", "bfloat16", "cuda")
    with pytest.raises(ValueError, match="^seq_lens"):
        mla_decode.batch_decode(case.query, case.kv_cache, case.block_tables,
                                case.seq_lens.cpu(), **case.kwargs())
