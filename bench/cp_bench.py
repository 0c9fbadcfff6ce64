"""Decode context parallelism benchmark: one layer (local decode, exchange, merge) on one GPU
against two (torchrun), CUDA-graph replays, medians. Never asserts a time.

    python bench/cp_bench.py --json one.json                        # one GPU: the whole sequence
    torchrun --nproc_per_node=2 bench/cp_bench.py --json two.json --baseline one.json

Grid: B 1 and 8, seq 262144 and 1048576, H 128 and 16 (q_len 1, bf16, L 512, R 64, page 64). On
two GPUs each rank holds every other token. Reported per row: the layer's median time, the local
decode's, the exchange + merge share of the layer, the NCCL exchange alone, the merge kernel alone
with its bandwidth (bytes read and written once over its time), and with --baseline the speedup
over one GPU. On one GPU the merge is also timed at 2 parts of [1024, 128, 512] bf16, where its
bytes set its time.

Each graph holds --layers calls back to back (default 8) and a time is the replay's over the
calls, as a decode step of many layers runs them: a replay's launch is paid once per step, not
once per layer. Each timed replay is queued right behind an untimed one, whose exchanges wait for
the later rank: the host's skew between the ranks' replays (tens of microseconds) is not timed.
--layers 1 times one call per replay. Every call of a graph reads the same cache, at least twice
the L2's size, so a call finds little of it in L2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

import mla_decode
from mla_decode import distributed

L, R, PAGE = 512, 64, 64


def median_ms(fn, iters, layers=1, warmup=3):
    """Median of `iters` replays of a CUDA graph of `layers` calls of fn, timed with events, one
    replay each, over `layers`: the time of one call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(layers):
                fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # NOTE: the untimed replay first. On two GPUs the host starts the ranks' replays tens of
        # microseconds apart; the first replay's exchanges wait for the later rank, so the timed
        # replay, queued right behind it, starts with the ranks in step (as the layers of a decode
        # step run). One GPU is timed the same way.
        graph.replay()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times) / layers


def run_case(batch, seq, heads, world, rank, layer, iters, layers):
    dev = torch.device("cuda", torch.cuda.current_device())
    local = -(-(seq - rank) // world)
    pages = -(-local // PAGE)
    kv = torch.randn(batch * pages, PAGE, L + R, device=dev, dtype=torch.bfloat16)
    table = torch.arange(batch * pages, device=dev, dtype=torch.int32).view(batch, pages)
    q = torch.randn(batch, 1, heads, L + R, device=dev, dtype=torch.bfloat16)
    local_lens = torch.full((batch,), local, device=dev, dtype=torch.int32)
    global_lens = torch.full((batch,), seq, device=dev, dtype=torch.int32)
    scale = 1.0 / (L + R) ** 0.5
    row = dict(B=batch, seq=seq, H=heads, gpus=world)
    if layer is None:  # one GPU: the plain decode of the whole sequence
        ws = mla_decode.make_workspace(q, kv, table, local_lens, kv_lora_rank=L)
        out = torch.empty(batch, 1, heads, L, device=dev, dtype=torch.bfloat16)
        fn = lambda: mla_decode.batch_decode(q, kv, table, local_lens, workspace=ws, out=out,  # noqa
                                             kv_lora_rank=L, bmm1_scale=scale, enable_pdl=True)
        row["layer_ms"] = row["local_ms"] = median_ms(fn, iters, layers)
        row["exchange_share"] = 0.0
        del kv
        return row
    kw = dict(kv_lora_rank=L, bmm1_scale=scale)
    out = torch.empty(batch, 1, heads if layer.method != "all_to_all" else heads // world, L,
                      device=dev, dtype=torch.bfloat16)
    layer(q, kv, table, local_lens, global_lens, out=out, **kw)  # allocates the buffers
    state = layer.local(q, kv, table, local_lens, global_lens, **kw)
    row["layer_ms"] = median_ms(
        lambda: layer(q, kv, table, local_lens, global_lens, out=out, **kw), iters, layers)
    row["local_ms"] = median_ms(
        lambda: layer.local(q, kv, table, local_lens, global_lens, **kw), iters, layers)
    row["exchange_share"] = max(0.0, 1.0 - row["local_ms"] / row["layer_ms"])
    row["exchange_ms"] = median_ms(lambda: layer.exchange(state), iters, layers)
    # The merge kernel alone over the exchanged parts.
    layer.exchange(state)
    row["merge_ms"] = median_ms(lambda: layer.merge(state, out=out), iters, layers)
    parts = state["parts"] if layer.method != "all_to_all" else state["recv_out"]
    n, t, h, width = parts.shape
    moved = n * t * h * width * 2 + t * h * width * 2 + n * t * h * 4
    row["merge_tb_s"] = moved / (row["merge_ms"] * 1e-3) / 1e12
    del kv
    return row


def merge_alone(iters, n=2, t=1024, h=128):
    """The merge kernel on one GPU at a size where its bytes, not the launch, set the time: n parts
    of [t, h, 512] bf16 and their lse. Returns (us, TB/s of bytes read and written once)."""
    parts = torch.randn(n, t, h, L, device="cuda", dtype=torch.bfloat16)
    lses = torch.randn(n, t, h, device="cuda", dtype=torch.float32)
    out = torch.empty(t, h, L, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(t, h, device="cuda", dtype=torch.float32)
    ms = median_ms(lambda: mla_decode.merge_states(parts, lses, out=out, lse=lse), iters)
    moved = parts.numel() * 2 + lses.numel() * 4 + out.numel() * 2 + lse.numel() * 4
    return ms * 1e3, moved / (ms * 1e-3) / 1e12


def copy_bandwidth_tb_s(iters):
    """The device's copy bandwidth through the SMs: 1 GiB read and written (bytes / time)."""
    a = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    # NOTE: an elementwise kernel, not copy_(): captured in a graph, a device-to-device memcpy
    # runs on the copy engines (~2.7 TB/s on an H200 against ~4.2 through the SMs).
    ms = median_ms(lambda: torch.mul(a, 1, out=b), iters)
    return 2 * a.numel() * 2 / (ms * 1e-3) / 1e12


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--baseline", help="the one-GPU JSON, for the speedup column")
    parser.add_argument("--method", choices=distributed.METHODS, default="all_gather")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--layers", type=int, default=8,
                        help="calls per graph, back to back (1: one call per replay)")
    parser.add_argument("--quick", action="store_true", help="B 1 and seq 262144 only")
    args = parser.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    layer = None
    if world > 1:
        torch.distributed.init_process_group(
            "nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        layer = distributed.ContextParallelDecode(method=args.method)
    rows = []
    for batch in (1,) if args.quick else (1, 8):
        for seq in (262144,) if args.quick else (262144, 1048576):
            for heads in (128, 16):
                row = run_case(batch, seq, heads, world, rank, layer, args.iters, args.layers)
                row["method"] = args.method if layer else "single"
                rows.append(row)
                torch.cuda.empty_cache()
    copy_bw = copy_bandwidth_tb_s(args.iters)
    merge = merge_alone(args.iters) if world == 1 else None
    if rank != 0:
        torch.distributed.destroy_process_group()
        return
    base = {}
    if args.baseline and os.path.exists(args.baseline):
        with open(args.baseline) as f:
            base = {(r["B"], r["seq"], r["H"]): r["layer_ms"] for r in json.load(f)["rows"]}
    print(f"device copy bandwidth: {copy_bw:.2f} TB/s ({torch.cuda.get_device_name()}); "
          f"{args.layers} calls per graph, method {args.method}")
    if merge is not None:
        print(f"merge alone (2 parts of [1024, 128, 512] bf16): {merge[0]:.1f} us, "
              f"{merge[1]:.2f} TB/s = {100 * merge[1] / copy_bw:.0f}% of copy")
    print("| B | seq | H | GPUs | layer us | local decode us | exchange+merge share | "
          "1 GPU us | speedup | exchange us | merge us | merge TB/s (% of copy) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        one = base.get((r["B"], r["seq"], r["H"]))
        r["speedup"] = one / r["layer_ms"] if one else None
        merge = (f"{r['exchange_ms'] * 1e3:.1f} | {r['merge_ms'] * 1e3:.1f} | "
                 f"{r['merge_tb_s']:.2f} ({100 * r['merge_tb_s'] / copy_bw:.0f}%)"
                 ) if "merge_ms" in r else "- | - | -"
        print(f"| {r['B']} | {r['seq']} | {r['H']} | {r['gpus']} | {r['layer_ms'] * 1e3:.1f} | "
              f"{r['local_ms'] * 1e3:.1f} | {100 * r['exchange_share']:.1f}% | "
              f"{one * 1e3 if one else float('nan'):.1f} | "
              f"{r['speedup'] if r['speedup'] else float('nan'):.2f}x | {merge} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_tb_s": copy_bw, "layers": args.layers, "rows": rows,
                       "merge_alone": None if merge is None else {"us": merge[0],
                                                                  "tb_s": merge[1]}}, f, indent=1)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
