"""Decode context parallelism on GPUs over NCCL (mla_decode.distributed), one process per GPU:

    torchrun --nproc_per_node=2 -m pytest tests/python/test_distributed.py -q

Each rank builds the same request (same seed), keeps its shard (token t on rank t % world), runs the
layer call (local decode, exchange, merge) and compares with the single-GPU decode of the whole
sequence on its own GPU, within the bound of docs/context-parallel.md (the one of
test_context_parallel.py). Skips without torch, without two CUDA GPUs or outside torchrun.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA GPUs", allow_module_level=True)
if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) < 2:
    pytest.skip("run under torchrun --nproc_per_node=2", allow_module_level=True)

import mla_decode  # noqa: E402
from mla_decode import distributed  # noqa: E402

L, R, PAGE = 512, 64, 64


@pytest.fixture(scope="module")
def group():
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    yield dist.group.WORLD


def build(seed, batch, q_len, heads, seq_lens, kv_dtype, world, rank):
    g = torch.Generator().manual_seed(seed)
    dev = torch.device("cuda", torch.cuda.current_device())
    query = torch.randn(batch, q_len, heads, L + R, generator=g).to(torch.bfloat16)
    tokens = [torch.randn(int(s), L + R, generator=g) for s in seq_lens]

    def paged(rows_per_request):
        pages = [max(1, -(-len(rows) // PAGE)) for rows in rows_per_request]
        pool = torch.full((sum(pages) + 1, PAGE, L + R), float("nan"))
        table = torch.full((batch, max(pages)), 10**6, dtype=torch.int32)
        nxt = 0
        for b, rows in enumerate(rows_per_request):
            for p in range(pages[b]):
                table[b, p] = nxt
                chunk = rows[p * PAGE:(p + 1) * PAGE]
                pool[nxt, : len(chunk)] = chunk
                nxt += 1
        return pool.to(kv_dtype).to(dev), table.to(dev)

    full_kv, full_table = paged(tokens)
    local_kv, local_table = paged([rows[rank::world] for rows in tokens])
    global_lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
    local_lens = torch.tensor([len(rows[rank::world]) for rows in tokens], dtype=torch.int32,
                              device=dev)
    return query.to(dev), full_kv, full_table, global_lens, local_kv, local_table, local_lens


CASES = [
    # (batch, q_len, heads, seq_lens)
    (1, 1, 128, [5000]),
    (1, 2, 128, [5001]),
    (4, 1, 16, [1, 3000, 777, 64]),  # ragged, one request shorter than the world
    (3, 2, 16, [2, 4097, 1500]),
]


@pytest.mark.parametrize("method", distributed.METHODS)
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("batch,q_len,heads,seq_lens", CASES)
def test_matches_single_gpu(group, method, kv_dtype, with_sinks, batch, q_len, heads, seq_lens):
    world, rank = dist.get_world_size(), dist.get_rank()
    q, full_kv, full_table, glens, kv, table, llens = build(
        1234, batch, q_len, heads, seq_lens, getattr(torch, kv_dtype), world, rank
    )
    scale = 1.0 / (L + R) ** 0.5
    sinks = torch.linspace(-1, 3, heads, device=q.device) if with_sinks else None
    want, want_lse = mla_decode.batch_decode(q, full_kv, full_table, glens, kv_lora_rank=L,
                                             bmm1_scale=scale, sinks=sinks, return_lse=True)
    layer = distributed.ContextParallelDecode(group, method=method)
    got, lse = layer(q, kv, table, llens, glens, sinks=sinks, bmm1_scale=scale, kv_lora_rank=L,
                     return_lse=True)
    torch.cuda.synchronize()
    if method == "all_to_all":
        hn = heads // world
        heads_of_rank = slice(rank * hn, (rank + 1) * hn)
        want, want_lse = want[:, :, heads_of_rank], want_lse[:, :, heads_of_rank]
    got64, want64 = got.double(), want.double()
    assert not torch.isnan(got64).any()
    # docs/context-parallel.md: roundings of half an ulp (at most 2^-8 of the value, bfloat16) of
    # the values and terms involved, plus fp32 noise; the terms bounded by the row's largest
    # |value| (the ranks' P is rounded to 16 bits too, which the row term covers).
    row_max = want64.abs().amax(-1, keepdim=True)
    allowed = 2.0**-8 * (want64.abs() + got64.abs() + 2 * row_max) + 2.0**-16 * row_max + 1e-30
    assert ((got64 - want64).abs() <= allowed).all()
    empty = torch.isneginf(want_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    assert torch.allclose(lse[~empty], want_lse[~empty], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", distributed.METHODS)
def test_cuda_graph_replay_matches_eager(group, method):
    world, rank = dist.get_world_size(), dist.get_rank()
    q, _, _, glens, kv, table, llens = build(99, 2, 2, 128, [9000, 300], torch.bfloat16, world,
                                             rank)
    layer = distributed.ContextParallelDecode(group, method=method)
    eager = layer(q, kv, table, llens, glens, kv_lora_rank=L).clone()
    q2 = torch.flip(q, dims=[2]).contiguous()
    eager2 = layer(q2, kv, table, llens, glens, kv_lora_rank=L).clone()
    out = torch.empty_like(eager)
    live = q.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        layer(live, kv, table, llens, glens, kv_lora_rank=L, out=out)  # warm-up on the stream
        with torch.cuda.graph(graph, stream=stream):
            layer(live, kv, table, llens, glens, kv_lora_rank=L, out=out)
    # Replays with new queries: each replay is a new exchange step on every rank.
    for query, want in ((q, eager), (q2, eager2), (q2, eager2), (q, eager)):
        live.copy_(query)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


@pytest.mark.parametrize("method", distributed.METHODS)
def test_layers_back_to_back(group, method):
    """Eight layer calls queued without a host sync, each with its own query and output: a rank's
    next exchange must not land in a peer's buffer before the peer has merged the previous one."""
    world, rank = dist.get_world_size(), dist.get_rank()
    q, _, _, glens, kv, table, llens = build(7, 1, 1, 128, [20000], torch.bfloat16, world, rank)
    layer = distributed.ContextParallelDecode(group, method=method)
    queries = [q * (1.0 + 0.25 * i) for i in range(8)]
    want = []
    for x in queries:  # one call at a time
        want.append(layer(x, kv, table, llens, glens, kv_lora_rank=L))
        torch.cuda.synchronize()
    got = [layer(x, kv, table, llens, glens, kv_lora_rank=L) for x in queries]
    torch.cuda.synchronize()
    for i in range(8):
        assert torch.equal(got[i], want[i]), i


@pytest.mark.parametrize("batch,q_len,heads,seq_lens", CASES)
def test_p2p_equals_all_gather(group, batch, q_len, heads, seq_lens):
    """The p2p method moves the same bytes into the same merge as all_gather: equal bit for bit."""
    world, rank = dist.get_world_size(), dist.get_rank()
    q, _, _, glens, kv, table, llens = build(5, batch, q_len, heads, seq_lens, torch.bfloat16,
                                             world, rank)
    sinks = torch.linspace(-2, 2, heads, device=q.device)
    results = []
    for method in ("all_gather", "p2p"):
        layer = distributed.ContextParallelDecode(group, method=method)
        results.append(layer(q, kv, table, llens, glens, sinks=sinks, kv_lora_rank=L,
                             return_lse=True))
    torch.cuda.synchronize()
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
