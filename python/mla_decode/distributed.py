"""Decode context parallelism (DCP): a request's KV cache sharded over the ranks of a
torch.distributed process group, token t of the sequence on rank ``t % cp_world``.

One call per layer (:class:`ContextParallelDecode`): each rank attends its own shard (the local
decode, with FlashInfer's DCP semantics below), the ranks exchange their partial (out, lse) over
NCCL, and the partial states are merged exactly by their lse (:func:`mla_decode.merge_states`),
with the sinks applied once, after the merge. docs/context-parallel.md has the design and the error
bound; docs/contract.md section 7 the promise.

The rank-local arguments follow FlashInfer's ``enable_dcp`` / ``cp_world`` / ``cp_rank`` /
``causal_seqlens_kv_global`` (its cute-dsl MLA decode) and vLLM's decode context parallelism:

- ``kv_cache`` and ``block_tables`` are the rank's: local key k of request b is row
  ``k % page_size`` of page ``block_tables[b][k // page_size]`` and holds global token
  ``k * cp_world + cp_rank``.
- ``seq_lens[b]`` is the number of the request's tokens stored on this rank,
  ``ceil((G_b - cp_rank) / cp_world)`` for a global length G_b.
- ``causal_seqlens_kv_global[b]`` is G_b, the global sequence length, query tokens included (the
  exclusive causal bound of the newest query token). Query token i of n sits at global position
  ``G_b - n + i`` and attends the local keys whose global position is at most that.

Nothing here syncs with the host or allocates after the first call of a shape, so a decode step of
layers can be captured in a CUDA graph (make one eager call per shape first).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from . import _arrays
from ._api import Scale, Tensor, batch_decode, make_workspace
from ._lib import lib
from ._merge import merge_states

METHODS = ("all_gather", "all_to_all", "p2p")


def _floordiv(x: Any, d: int) -> Any:
    return x // d  # floor division for torch and NumPy integer tensors alike


def local_shard_args(
    seq_lens: Tensor,
    causal_seqlens_kv_global: Tensor,
    q_len: int,
    cp_world: int,
    cp_rank: int,
) -> Tuple[Tensor, Optional[Tensor]]:
    """The rank-local ``seq_lens`` and custom ``mask`` that make the library's causal rule
    (docs/contract.md section 2.1) equal FlashInfer's DCP rule on this rank's shard.

    With W = cp_world, r = cp_rank, G = causal_seqlens_kv_global and S = seq_lens (local), query
    token i of n sits at global position p_i = G - n + i and sees the local keys k with
    ``k * W + r <= p_i`` and ``k < S``: ``c_i = min(S, max(0, floor((p_i - r + W) / W)))`` of them.
    The local call then gets ``seq_lens = c_{n-1}`` (the newest token sees the most; for n = 1 that
    is S itself, when S is the shard's count of keys below G, and ``seq_lens`` passes through) and,
    for n > 1, a mask whose bit k of token i's row is set where key ``c_{n-1} - n + k`` is below
    c_i: the keys before the window are seen by every token, since ``c_{n-1} - c_0 <= n - 1``. For
    n = 1 no mask is needed. Computed on the tensors' device (PyTorch or NumPy), without a host sync.

    Returns ``(local_seq_lens [B] int32, mask [B, n, ceil(n / 32)] uint32 or None)``.
    """
    fw = _arrays.framework(seq_lens)
    n, w, r = int(q_len), int(cp_world), int(cp_rank)
    if n == 1:
        # NOTE: one query token at global position G - 1 sees every key of a shard that holds
        # the local count of keys below G (c_0 = S): seq_lens as given, no work on the device
        # (seven small kernels were a sixth of a 256K-token layer on two GPUs).
        if fw == "torch":
            import torch

            return seq_lens.to(torch.int32), None  # no copy where it is int32 already
        if fw == "numpy":
            import numpy as np

            return np.asarray(seq_lens).astype(np.int32, copy=False), None
    if fw == "torch":
        import torch

        s = seq_lens.to(torch.int64)
        g = causal_seqlens_kv_global.to(torch.int64)
        i = torch.arange(n, device=s.device, dtype=torch.int64)
        p = g[:, None] - n + i[None, :]
        c = torch.minimum(torch.clamp(_floordiv(p - r + w, w), min=0), s[:, None])
    elif fw == "numpy":
        import numpy as np

        s = np.asarray(seq_lens, dtype=np.int64)
        g = np.asarray(causal_seqlens_kv_global, dtype=np.int64)
        i = np.arange(n, dtype=np.int64)
        p = g[:, None] - n + i[None, :]
        c = np.minimum(np.maximum(_floordiv(p - r + w, w), 0), s[:, None])
    else:
        raise TypeError(
            f"seq_lens: context parallelism computes the rank-local arguments with PyTorch or "
            f"NumPy, got a {type(seq_lens).__name__}"
        )
    newest = c[:, n - 1]
    if n == 1:
        return (newest.to(torch.int32) if fw == "torch" else newest.astype(np.int32)), None
    words = (n + 31) // 32
    if fw == "torch":
        k = torch.arange(n, device=s.device, dtype=torch.int64)
        seen = (newest[:, None, None] - n + k[None, None, :]) < c[:, :, None]  # [B, n, n]
        padded = torch.zeros(seen.shape[:2] + (words * 32,), dtype=torch.int64, device=s.device)
        padded[:, :, :n] = seen.to(torch.int64)
        weights = torch.bitwise_left_shift(
            torch.ones(32, dtype=torch.int64, device=s.device),
            torch.arange(32, dtype=torch.int64, device=s.device),
        )
        value = (padded.view(-1, n, words, 32) * weights).sum(-1)  # [B, n, words], < 2^32
        value = torch.where(value >= 2**31, value - 2**32, value)
        mask = value.to(torch.int32).view(torch.uint32)
        return newest.to(torch.int32), mask
    k = np.arange(n, dtype=np.int64)
    seen = (newest[:, None, None] - n + k[None, None, :]) < c[:, :, None]
    padded = np.zeros(seen.shape[:2] + (words * 32,), dtype=np.uint64)
    padded[:, :, :n] = seen
    weights = np.left_shift(np.uint64(1), np.arange(32, dtype=np.uint64))
    mask = (padded.reshape(seen.shape[0], n, words, 32) * weights).sum(-1).astype(np.uint32)
    return newest.astype(np.int32), mask


def local_decode(
    query: Tensor,
    kv_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    causal_seqlens_kv_global: Tensor,
    cp_world: int,
    cp_rank: int,
    *,
    out: Optional[Tensor] = None,
    lse: Optional[Tensor] = None,
    **decode_kwargs: Any,
) -> Tuple[Tensor, Tensor]:
    """This rank's partial state ``(out, lse)`` over its shard (FlashInfer's DCP semantics, module
    docstring), without sinks (they apply once, after the merge). ``query`` is dense
    ``[B, q_len, H, D]``; other keyword arguments go to :func:`mla_decode.batch_decode`
    (``sinks`` and ``mask`` are refused: see docs/context-parallel.md)."""
    for name in ("sinks", "mask", "cum_seq_lens_q", "sparse_indices", "sparse_top_k"):
        if decode_kwargs.get(name) not in (None, 0):
            raise ValueError(
                f"{name}: not accepted by the context-parallel local decode (sinks apply once "
                "after the merge; custom masks, ragged queries and sparse mode are not supported "
                "with context parallelism)"
            )
    shape = _arrays.shape(query)
    if len(shape) != 4:
        raise ValueError(
            f"query: context parallelism takes a dense [B, q_len, H, D] query, got shape "
            f"{list(shape)}"
        )
    if not 0 <= int(cp_rank) < int(cp_world):
        raise ValueError(f"cp_rank: expected 0 <= cp_rank < cp_world ({cp_world}), got {cp_rank}")
    local_lens, mask = local_shard_args(
        seq_lens, causal_seqlens_kv_global, shape[1], cp_world, cp_rank
    )
    return batch_decode(
        query,
        kv_cache,
        block_tables,
        local_lens,
        out=out,
        lse=lse,
        return_lse=True,
        mask=mask,
        **decode_kwargs,
    )


class ContextParallelDecode:
    """One decode-context-parallel layer call per ``__call__``: local decode, exchange, merge.

    Args:
        group: the torch.distributed process group of the context-parallel ranks (default: the
            world); its backend should be NCCL, one GPU per rank.
        method: how the partial states travel:
            ``"all_gather"``: every rank gathers all ranks' (out, lse) for every head and merges;
            the result is the whole ``[B, q_len, H, L]`` on every rank.
            ``"all_to_all"``: rank j receives every rank's heads ``[j * H / N, (j + 1) * H / N)``
            and merges those (vLLM's a2a); the result is this rank's head slice
            ``[B, q_len, H / N, L]`` (the layout a head-sharded output projection takes).
            ``"p2p"``: as ``"all_gather"``, but the states travel by the library's peer exchange
            kernel (:func:`mla.peer_exchange`, include/mla/exchange.h) through a buffer in
            PyTorch's symmetric memory (``torch.distributed._symmetric_memory``, mapped into
            every rank over NVLink) instead of an NCCL call: a few microseconds a layer instead of
            NCCL's ~9 (docs/context-parallel.md). Needs peer access between the GPUs.
        backend, enable_pdl: as in :func:`mla_decode.batch_decode` (enable_pdl None: on for CUDA).

    Buffers (gathered parts, workspace) are allocated on the first call of each shape and reused,
    so later calls, and CUDA graphs captured after the first call, allocate nothing.
    """

    def __init__(
        self,
        group: Any = None,
        *,
        method: str = "all_gather",
        backend: str = "auto",
        enable_pdl: Optional[bool] = None,
    ) -> None:
        import torch.distributed as dist

        if method not in METHODS:
            raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
        self.group = group
        self.method = method
        self.backend = backend
        self.enable_pdl = enable_pdl
        self.cp_world = dist.get_world_size(group)
        self.cp_rank = dist.get_rank(group)
        self._buffers: Dict[Tuple[Any, ...], Dict[str, Any]] = {}

    def _state(self, query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
               kv_lora_rank: int, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        import torch

        b, q_len, h, _ = query.shape
        n = self.cp_world
        key = (tuple(query.shape), query.dtype, tuple(kv_cache.shape), kv_cache.dtype,
               tuple(block_tables.shape), kv_lora_rank, query.device)
        state = self._buffers.get(key)
        if state is not None:
            return state
        if self.method == "all_to_all" and h % n:
            raise ValueError(
                f"query: method all_to_all splits the heads over the ranks: expected H divisible "
                f"by cp_world {n}, got H {h}"
            )
        out_dtype = query.dtype if query.dtype in (torch.bfloat16, torch.float16) else (
            torch.bfloat16)
        t = b * q_len
        dev = query.device
        # The ranks' partial states in one gather buffer, row r = rank r's out then its lse, so
        # that one all-gather moves both (all_gather: this rank's row is written in place).
        # NOTE: two NCCL calls cost ~6 us more per layer than one at these sizes.
        out_bytes = t * h * kv_lora_rank * torch.finfo(out_dtype).bits // 8
        lse_at = (out_bytes + 15) // 16 * 16  # parts 16-byte aligned (peer exchange lines)
        row_bytes = lse_at + (t * h * 4 + 15) // 16 * 16
        state: Dict[str, Any] = {}
        if self.method == "p2p":
            gather = self._symmetric_buffer(state, n, row_bytes, dev)
        else:
            gather = torch.empty((n, row_bytes), dtype=torch.uint8, device=dev)
        state.update({
            "gather": gather,
            "row_bytes": row_bytes,
            "parts": gather[:, :out_bytes].view(out_dtype).view(n, t, h, kv_lora_rank),
            "lse_parts": (
                gather[:, lse_at:lse_at + t * h * 4].view(torch.float32).view(n, t, h)
            ),
            "workspace": make_workspace(
                query, kv_cache, block_tables, seq_lens, kv_lora_rank=kv_lora_rank,
                mask=None if q_len == 1 else torch.zeros(
                    (b, q_len, (q_len + 31) // 32), dtype=torch.int32, device=dev
                ).view(torch.uint32),
                **{k: v for k, v in kwargs.items() if k in ("qk_rope_head_dim", "max_seq_len")},
            ),
        })
        if self.method == "all_to_all":
            hn = h // n
            state["local_out"] = torch.empty((t, h, kv_lora_rank), dtype=out_dtype, device=dev)
            state["local_lse"] = torch.empty((t, h), dtype=torch.float32, device=dev)
            state["send_out"] = torch.empty((n, t, hn, kv_lora_rank), dtype=out_dtype, device=dev)
            state["send_lse"] = torch.empty((n, t, hn), dtype=torch.float32, device=dev)
            state["recv_out_buf"] = torch.empty((n, t, hn, kv_lora_rank), dtype=out_dtype,
                                                device=dev)
            state["recv_lse_buf"] = torch.empty((n, t, hn), dtype=torch.float32, device=dev)
        self._buffers[key] = state
        return state

    def _pdl(self, tensor: Any) -> bool:
        return bool(tensor.is_cuda) if self.enable_pdl is None else bool(self.enable_pdl)

    def _symmetric_buffer(self, state: Dict[str, Any], n: int, row_bytes: int, dev: Any) -> Any:
        """The p2p method's buffer: n slots of row_bytes, then the exchange's landing area and
        step counters (include/mla/exchange.h), in PyTorch's symmetric memory (every rank's
        buffer mapped into every rank); zeroed on every rank before any rank's first exchange.
        Returns the [n, row_bytes] view of the slots."""
        import torch
        import torch.distributed as dist

        try:
            import torch.distributed._symmetric_memory as symm_mem
        except ImportError as e:  # pragma: no cover - PyTorch without symmetric memory
            raise RuntimeError(
                "method p2p: needs torch.distributed._symmetric_memory (PyTorch with CUDA); use "
                "method all_gather"
            ) from e
        group = self.group if self.group is not None else dist.group.WORLD
        total = int(lib().peer_exchange_buffer_bytes(n, row_bytes))
        buffer = symm_mem.empty(total, dtype=torch.uint8, device=dev)
        buffer.zero_()
        handle = symm_mem.rendezvous(buffer, group.group_name)
        torch.cuda.synchronize(dev)
        dist.barrier(group=group)  # no rank writes into a peer's buffer before it is zero
        state["symmetric"] = buffer
        state["symmetric_handle"] = handle  # keeps the peers' mappings alive
        state["peer_buffers"] = torch.tensor([int(p) for p in handle.buffer_ptrs],
                                             dtype=torch.int64)
        return buffer[: n * row_bytes].view(n, row_bytes)

    def local(self, query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
              causal_seqlens_kv_global: Tensor, *, kv_lora_rank: int = 512,
              **kwargs: Any) -> Dict[str, Any]:
        """Step 1: the local decode into the exchange buffers; returns the call's state."""
        state = self._state(query, kv_cache, block_tables, seq_lens, kv_lora_rank, kwargs)
        b, q_len, h, _ = query.shape
        if self.method != "all_to_all":
            out = state["parts"][self.cp_rank].view(b, q_len, h, kv_lora_rank)
            lse = state["lse_parts"][self.cp_rank].view(b, q_len, h)
        else:
            out = state["local_out"].view(b, q_len, h, kv_lora_rank)
            lse = state["local_lse"].view(b, q_len, h)
        enable_pdl = query.is_cuda if self.enable_pdl is None else self.enable_pdl
        local_decode(
            query, kv_cache, block_tables, seq_lens, causal_seqlens_kv_global, self.cp_world,
            self.cp_rank, out=out, lse=lse, workspace=state["workspace"],
            kv_lora_rank=kv_lora_rank, backend=self.backend, enable_pdl=enable_pdl, **kwargs,
        )
        state["shape"] = (b, q_len, h, kv_lora_rank)
        return state

    def exchange(self, state: Dict[str, Any]) -> None:
        """Step 2: the partial states over NCCL (all-gather, or all-to-all by heads), or over peer
        memory (p2p)."""
        import torch.distributed as dist

        n = self.cp_world
        if self.method == "p2p":
            buffer = state["symmetric"]
            lib().peer_exchange(
                buffer, state["peer_buffers"], self.cp_rank, state["row_bytes"],
                self.backend,
                self._pdl(buffer), _arrays.current_stream(buffer),
            )
            return
        if self.method == "all_gather":
            gather = state["gather"]
            # NOTE: in place: this rank's out and lse are already its row of the gather buffer.
            dist.all_gather_into_tensor(gather, gather[self.cp_rank], group=self.group)
            return
        t, h, width = state["local_out"].shape
        hn = h // n
        state["send_out"].copy_(state["local_out"].view(t, n, hn, width).transpose(0, 1))
        state["send_lse"].copy_(state["local_lse"].view(t, n, hn).transpose(0, 1))
        # The received parts, [N, T, H / N, L]: the front of the (larger) gather buffers.
        recv_out = state["recv_out_buf"]
        recv_lse = state["recv_lse_buf"]
        dist.all_to_all_single(recv_out, state["send_out"], group=self.group)
        dist.all_to_all_single(recv_lse, state["send_lse"], group=self.group)
        state["recv_out"], state["recv_lse"] = recv_out, recv_lse

    def merge(self, state: Dict[str, Any], *, sinks: Optional[Tensor] = None,
              out: Optional[Tensor] = None, lse: Optional[Tensor] = None,
              return_lse: bool = False) -> Any:
        """Step 3: the merge (sinks applied here, once)."""
        b, q_len, h, width = state["shape"]
        enable_pdl = bool(self.enable_pdl) if self.enable_pdl is not None else True
        if self.method != "all_to_all":
            parts, lse_parts, heads = state["parts"], state["lse_parts"], h
        else:
            parts, lse_parts, heads = state["recv_out"], state["recv_lse"], h // self.cp_world
            if sinks is not None:
                sinks = sinks[self.cp_rank * heads:(self.cp_rank + 1) * heads]
        if out is None:
            out = _arrays.empty(parts, (b, q_len, heads, width), _arrays.dtype_name(parts))
        if lse is None and return_lse:
            lse = _arrays.empty(parts, (b, q_len, heads), "float32")
        merge_states(
            parts,
            lse_parts,
            out=out.view(b * q_len, heads, width),
            lse=None if lse is None else lse.view(b * q_len, heads),
            sinks=sinks,
            backend=self.backend,
            enable_pdl=enable_pdl and parts.is_cuda,
        )
        return (out, lse) if return_lse else out

    def __call__(
        self,
        query: Tensor,
        kv_cache: Tensor,
        block_tables: Tensor,
        seq_lens: Tensor,
        causal_seqlens_kv_global: Tensor,
        *,
        sinks: Optional[Tensor] = None,
        bmm1_scale: Scale = 1.0,
        bmm2_scale: Scale = 1.0,
        kv_lora_rank: int = 512,
        qk_rope_head_dim: int = 64,
        qk_nope_head_dim: int = 128,
        max_seq_len: Optional[int] = None,
        out: Optional[Tensor] = None,
        lse: Optional[Tensor] = None,
        return_lse: bool = False,
    ) -> Any:
        """One layer: local decode on this rank's shard, exchange, merge.

        Args:
            query: ``[B, q_len, H, D]`` (every rank the same); kv_cache, block_tables, seq_lens:
                this rank's shard and its local lengths; causal_seqlens_kv_global: ``[B]`` int32
                global lengths (module docstring). sinks: ``[H]``, applied once after the merge.
            bmm1_scale, bmm2_scale, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
                max_seq_len (a bound of the LOCAL seq_lens): as in batch_decode.
            out, lse, return_lse: the merged result (method all_to_all: this rank's heads).
        """
        state = self.local(
            query, kv_cache, block_tables, seq_lens, causal_seqlens_kv_global,
            kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
            qk_nope_head_dim=qk_nope_head_dim, max_seq_len=max_seq_len, bmm1_scale=bmm1_scale,
            bmm2_scale=bmm2_scale,
        )
        self.exchange(state)
        return self.merge(state, sinks=sinks, out=out, lse=lse, return_lse=return_lse)
