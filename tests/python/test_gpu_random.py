"""Random combinations of the whole contract on the sm90 backend against the float64 reference.

Each seed draws one call: heads 1..128, dense q_len 1..16 (causal) or ragged lengths 0..16, page
sizes 1..256, seq_lens from 0 and below q_len to 70K, every dtype pair (an e4m3 query over an
e4m3 cache runs dense calls, and sparse calls of at most 32 heads, on the FP8 tensor cores, with
their own allowance below), bf16 or fp16 out, 3-D or 4-D KV, padded query strides, sinks, custom
masks, sparse top-k with and without lens, scales as floats or device tensors, skip-softmax at
f = 1e-30 (the dense result), PDL and the checked mode. Outputs are NaN-poisoned, unused KV rows
and pages hold NaN, unused block_tables slots an invalid page.
Skipped unless PyTorch sees a compute-capability 9.0 GPU and this build has the sm90 backend.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import mla_decode
from cases import make_case, random_mask, sparse_case
from sm90_gpu import require_sm90

torch = require_sm90()

from test_torch import reference_of, to_torch  # noqa: E402

# out: |err| <= tol * (1 + |ref|), tol from the coarsest of the input and output dtypes (P is
# rounded to a 16-bit or 8-bit type before P V). lse: fp32 from fp32 scores.
OUT_TOL = {"bfloat16": 2e-2, "float16": 5e-3, "float8_e4m3fn": 5e-2}
LSE_ATOL = 2e-5
LSE_RTOL = 2e-5
MAX_REFERENCE_WORK = 2e7  # query rows x longest sequence, to keep the float64 reference quick


def draw(seed):
    """One random call: (case, call kwargs, reference kwargs, (kv dtype, out dtype), sparse,
    description)."""
    rng = np.random.default_rng(seed)
    H = int(rng.integers(1, 129)) if rng.random() < 0.5 else int(rng.choice([16, 32, 64, 128]))
    B = int(rng.integers(1, 6))
    ragged = rng.random() < 0.25
    if ragged:
        q_lens = [int(n) for n in rng.integers(0, 17, B)]
        q_len = max(q_lens)
    else:
        q_len = int(rng.choice([1, 1, 2, 2, 3, 4, 4, 5, 8, 16]))
        q_lens = [q_len] * B
    page = int(2 ** rng.integers(0, 9))
    seq = []
    for n in q_lens:
        r = rng.random()
        if r < 0.1:
            seq.append(0)
        elif r < 0.2:
            seq.append(n + int(rng.integers(0, 6)))  # the query's own keys, or fewer with n > s
        elif r < 0.3:
            seq.append(int(rng.integers(10000, 70000)))
        else:
            seq.append(int(rng.integers(max(n, 1), 3000)))
    rows = max(sum(q_lens) * H, 1)
    seq = [min(s, max(n, int(MAX_REFERENCE_WORK // rows))) for n, s in zip(q_lens, seq)]
    r = rng.random()
    if r < 0.1:
        q_dt = kv_dt = "float8_e4m3fn"
    elif r < 0.2:
        q_dt, kv_dt = "bfloat16", "float8_e4m3fn"
    else:
        q_dt = kv_dt = str(rng.choice(["bfloat16", "float16"]))
    # out: mostly the query's 16-bit type, else either (fp8 queries: either).
    out_dt = (q_dt if q_dt != "float8_e4m3fn" and rng.random() < 0.7
              else str(rng.choice(["bfloat16", "float16"])))
    case = make_case(rng, batch=B, q_len=q_len, heads=H, kv_lora_rank=512, rope_dim=64,
                     page_size=page, seq_lens=seq, ragged_q_lens=q_lens if ragged else None,
                     kv_4d=bool(rng.random() < 0.2))
    kw, ref_kw = {}, {}
    sparse = rng.random() < 0.15 and sum(seq) > 0
    if sparse:
        top_k = int(rng.choice([1, 7, 64, 100, 256, 600]))
        indices = sparse_case(rng, case, top_k)
        kw.update(sparse_top_k=top_k, sparse_indices=torch.from_numpy(indices).cuda())
        ref_kw["sparse_indices"] = indices
        r = rng.random()
        lens = None
        if r < 0.3 and not ragged:  # per request: [B], dense queries only (README)
            lens = rng.integers(0, top_k + 1, size=(B,)).astype(np.int32)
        elif r < 0.6:
            lens = rng.integers(0, top_k + 1, size=indices.shape[:-1]).astype(np.int32)
        if lens is not None:
            kw["sparse_topk_lens"] = torch.from_numpy(lens).cuda()
            ref_kw["sparse_topk_lens"] = lens
    case = to_torch(case, q_dt, kv_dt, "cuda")
    if rng.random() < 0.1:
        kw["skip_softmax_threshold_scale_factor"] = 1e-30
    bmm1, bmm2 = float(rng.uniform(0.02, 0.09)), float(rng.uniform(0.5, 2.0))
    if rng.random() < 0.3:
        kw["bmm1_scale"] = torch.tensor([bmm1], device="cuda")
        kw["bmm2_scale"] = torch.tensor([bmm2], device="cuda")
    else:
        kw.update(bmm1_scale=bmm1, bmm2_scale=bmm2)
    ref_kw.update(bmm1_scale=bmm1, bmm2_scale=bmm2)
    if rng.random() < 0.3:
        sinks = (rng.standard_normal(H) * 3).astype(np.float32)
        kw["sinks"] = torch.from_numpy(sinks).cuda()
        ref_kw["sinks"] = sinks
    if rng.random() < 0.2 and not sparse:
        mask = random_mask(rng, sum(q_lens), q_len)
        ref_kw["mask"] = mask if ragged else mask.reshape(B, q_len, -1)
        kw["mask"] = torch.from_numpy(ref_kw["mask"]).cuda()
    if ragged and rng.random() < 0.5:
        kw["max_q_len"] = q_len
    if rng.random() < 0.2:  # head and batch strides of a wider query
        q = case.query
        wide = torch.full(q.shape[:-2] + (H + 3, q.shape[-1]), float("nan"),
                          device="cuda").to(q.dtype)
        wide[..., :H, :] = q
        case.query = wide[..., :H, :]
    kw.update(enable_pdl=bool(rng.random() < 0.5), validate_indices=bool(rng.random() < 0.2))
    desc = (f"B={B} H={H} q_lens={q_lens if ragged else q_len} page={page} seq={seq} "
            f"{q_dt}/{kv_dt}->{out_dt} "
            + " ".join(k for k in kw if k not in ("bmm1_scale", "bmm2_scale")))
    return case, kw, ref_kw, (kv_dt, out_dt), sparse, desc


def seeds():
    """The seeds drawn: 9000..9095, or MLA_RANDOM_SEEDS=FIRST:COUNT (a longer or another draw on a
    GPU, for example 20000:2000)."""
    first, count = os.environ.get("MLA_RANDOM_SEEDS", "9000:96").split(":")
    return range(int(first), int(first) + int(count))


@pytest.mark.parametrize("seed", seeds())
def test_random_contract_case(seed):
    case, kw, ref_kw, (kv_dt, out_dt), sparse, desc = draw(seed)
    lead = tuple(case.query.shape[:-1])
    out = torch.full(lead + (512,), float("nan"), dtype=getattr(torch, out_dt), device="cuda")
    lse = torch.full(lead, float("nan"), dtype=torch.float32, device="cuda")
    mla_decode.batch_decode(case.query, case.kv_cache, None if sparse else case.block_tables,
                            case.seq_lens, cum_seq_lens_q=case.cum_seq_lens_q, out=out, lse=lse,
                            backend="sm90", **kw)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference_of(case, **ref_kw)
    got_out = out.cpu().to(torch.float64).numpy()
    got_lse = lse.cpu().to(torch.float64).numpy()
    q_dt = str(case.query.dtype).removeprefix("torch.")
    tol = max(OUT_TOL[q_dt], OUT_TOL[kv_dt], OUT_TOL[out_dt])
    lse_tol = LSE_ATOL + LSE_RTOL * np.abs(ref_lse)
    out_extra = 0.0
    heads = case.query.shape[-2]
    if q_dt == "float8_e4m3fn" and (not sparse or heads <= 32):
        # The FP8 tensor cores (every dense call of an e4m3 query over an e4m3 cache that the TMA
        # kernels take: the few-rows kernel and its tiles; and the sparse calls of at most 32
        # heads, whose tiles of one token's heads the few-rows kernel runs on the same data flow:
        # docs/sm90-sparse.md; tests/common/fp8_mma.h): the scores
        # accumulate in a narrower format, a score moving by up to
        # E = 3 2^-10 |bmm1| sum_d |q_d k_d| <= 3 2^-10 |bmm1| sum_d |q_d| max |k|, and lse with
        # it; out moves by up to exp(2E) - 1 of sum_j p_j |v_j| / Z <= |bmm2| max |v| for the
        # moved scores, and by 2^-3 of it for P rounded to e4m3 (half an ulp, twice).
        q_abs = np.abs(case.query.to(torch.float32).cpu().numpy().astype(np.float64)).sum(-1)
        kv = case.kv_cache.to(torch.float32).cpu().numpy().astype(np.float64)
        k_max = np.abs(kv[np.isfinite(kv)]).max(initial=0.0)
        e = 3 * 2.0**-10 * ref_kw["bmm1_scale"] * q_abs * k_max
        lse_tol = lse_tol + e
        out_extra = (abs(ref_kw["bmm2_scale"]) * k_max * (2.0**-3 + np.expm1(2 * e)))[..., None]
    assert not np.isnan(got_out).any(), desc
    out_err = np.abs(got_out - ref_out) - tol * (1 + np.abs(ref_out)) - out_extra
    assert (out_err <= 0).all(), f"{desc}: out off by up to {np.abs(got_out - ref_out).max():.3g}"
    finite = np.isfinite(ref_lse)
    assert np.array_equal(got_lse[~finite], ref_lse[~finite]), f"{desc}: lse of empty rows"
    lse_err = np.abs(got_lse[finite] - ref_lse[finite])
    assert (lse_err <= lse_tol[finite]).all(), f"{desc}: lse off by up to {lse_err.max():.3g}"
