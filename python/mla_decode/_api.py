"""batch_decode, workspace_size, make_workspace, plan/run: the package's native API.

Shapes use B (batch), q_len (query tokens per request), T (total query tokens of a ragged batch),
H (heads), L = kv_lora_rank, R = qk_rope_head_dim, D = L + R, P (pages). The contract is
docs/contract.md.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _arrays
from ._lib import lib

Tensor = Any  # any DLPack tensor: torch.Tensor, numpy.ndarray, cupy.ndarray, jax.Array
Scale = Union[float, Tensor]

BACKENDS = ("auto", "sm90", "cpu")
# FlashInfer's MLA decode backends for other GPU generations (sm100/sm103: trtllm-gen, cute-dsl;
# sm120/sm121: xqa, sparse).
BLACKWELL_BACKENDS = ("trtllm-gen", "xqa", "cute-dsl", "sparse")


def available_backends() -> List[str]:
    """Backends this build implements and can run here: 'cpu' always; 'sm90' once the Hopper
    backend is built (and usable on this machine)."""
    return list(_available_backends())


@functools.lru_cache(maxsize=None)
def _available_backends() -> Tuple[str, ...]:
    return tuple(b for b in ("sm90", "cpu") if lib().backend_available(b))


def check_backend(backend: Any) -> str:
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    if backend in BLACKWELL_BACKENDS:
        raise ValueError(
            f"backend: '{backend}' is one of FlashInfer's Blackwell (sm100/sm120) backends, which "
            f"this library does not implement; its backends are 'auto', 'sm90' (Hopper) and 'cpu' "
            f"(available in this build: {', '.join(available_backends())})"
        )
    return backend  # other names: the C++ side names the accepted ones


def _tensor(name: str, x: Any, required: bool = False, written: bool = False) -> Any:
    if x is None:
        if required:
            raise ValueError(f"{name}: expected a tensor, got None")
        return None
    if not _arrays.is_tensor(x):
        raise TypeError(
            f"{name}: expected a DLPack tensor (torch, numpy, cupy, jax), got {type(x).__name__}"
        )
    if written and _arrays.is_immutable(x):
        raise TypeError(
            f"{name}: JAX arrays are immutable and cannot be written; pass None (the result is "
            "allocated and returned as a JAX array) or a NumPy/PyTorch/CuPy array"
        )
    if _arrays.is_read_only(x):
        # NumPy refuses to export a read-only array through the DLPack version tvm-ffi asks for
        # (BufferError); an input is refused too, since that DLPack cannot mark it read-only.
        raise ValueError(
            f"{name}: expected a writable array, got a read-only NumPy array (flags.writeable is "
            "False); "
            + ("pass a writable array or None" if written else "pass a copy (x.copy())")
        )
    return x


def _output(name: str, x: Any) -> Any:
    return _tensor(name, x, written=True)


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    value = int(value)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{name}: expected a value that fits int64, got {value}")
    return value


def _bound(name: str, value: Any, default: str) -> int:
    """A host upper bound: None (``default``; the library's -1) or an int >= 0."""
    if value is None:
        return -1
    value = _int(name, value)
    if value < 0:
        raise ValueError(f"{name}: expected None ({default}) or a bound >= 0, got {value}")
    return value


def _float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    return float(value)


def _scale(name: str, value: Any) -> Tuple[float, Any]:
    """(host value, device tensor) of a scale given as a float or a 1-element fp32 tensor."""
    if _arrays.is_tensor(value) and not isinstance(value, numbers.Real):
        return 1.0, _tensor(name, value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value), None
    raise TypeError(
        f"{name}: expected a float or a 1-element float32 tensor, got {type(value).__name__}"
    )


# Per-call arguments; everything else is fixed when a Plan is made.
_PER_LAYER = (
    "sinks",
    "mask",
    "sparse_indices",
    "sparse_topk_lens",
    "bmm1_scale",
    "bmm2_scale",
    "skip_softmax_threshold_scale_factor",
    "enable_pdl",
    "stream",
)


class _Call:
    """One call's arguments, checked and converted for the C++ module (src/python/binding.cc)."""

    def __init__(
        self,
        query: Tensor,
        kv_cache: Tensor,
        block_tables: Optional[Tensor],
        seq_lens: Tensor,
        *,
        workspace: Optional[Tensor] = None,
        out: Optional[Tensor] = None,
        lse: Optional[Tensor] = None,
        kv_lora_rank: int = 512,
        qk_rope_head_dim: int = 64,
        qk_nope_head_dim: int = 128,
        max_seq_len: Optional[int] = None,
        cum_seq_lens_q: Optional[Tensor] = None,
        max_q_len: Optional[int] = None,
        sinks: Optional[Tensor] = None,
        mask: Optional[Tensor] = None,
        sparse_indices: Optional[Tensor] = None,
        sparse_topk_lens: Optional[Tensor] = None,
        sparse_top_k: int = 0,
        bmm1_scale: Scale = 1.0,
        bmm2_scale: Scale = 1.0,
        skip_softmax_threshold_scale_factor: Optional[float] = None,
        enable_pdl: bool = False,
        validate_indices: bool = False,
        backend: str = "auto",
        stream: Any = None,
    ) -> None:
        self.query = _tensor("query", query, required=True)
        self.kv_cache = _tensor("kv_cache", kv_cache, required=True)
        self.block_tables = _tensor("block_tables", block_tables)
        self.seq_lens = _tensor("seq_lens", seq_lens)
        self.cum_seq_lens_q = _tensor("cum_seq_lens_q", cum_seq_lens_q)
        self.sinks = _tensor("sinks", sinks)
        if self.sinks is not None and _arrays.is_numpy_bfloat16(self.sinks):
            raise TypeError(
                "sinks: a NumPy bfloat16 (ml_dtypes) array cannot be passed through DLPack; pass "
                "float32 or float16 sinks, or bfloat16 sinks from PyTorch or JAX"
            )
        self.mask = _tensor("mask", mask)
        self.sparse_indices = _tensor("sparse_indices", sparse_indices)
        self.sparse_topk_lens = _tensor("sparse_topk_lens", sparse_topk_lens)
        self.out = _output("out", out)
        self.lse = _output("lse", lse)
        self.workspace = _output("workspace", workspace)
        self.kv_lora_rank = _int("kv_lora_rank", kv_lora_rank)
        self.qk_rope_head_dim = _int("qk_rope_head_dim", qk_rope_head_dim)
        self.qk_nope_head_dim = _int("qk_nope_head_dim", qk_nope_head_dim)
        self.max_seq_len = _bound("max_seq_len", max_seq_len, "the block tables' capacity")
        self.max_q_len = _bound("max_q_len", max_q_len, "the query tokens T")
        self.sparse_top_k = _int("sparse_top_k", sparse_top_k)
        self.bmm1_scale, self.bmm1_scale_tensor = _scale("bmm1_scale", bmm1_scale)
        self.bmm2_scale, self.bmm2_scale_tensor = _scale("bmm2_scale", bmm2_scale)
        f = skip_softmax_threshold_scale_factor
        self.skip_softmax = 0.0 if f is None else _float("skip_softmax_threshold_scale_factor", f)
        self.enable_pdl = bool(enable_pdl)
        self.validate_indices = bool(validate_indices)
        self.backend = check_backend(backend)
        self.stream = _arrays.stream_handle(stream)
        if self.stream is None:
            self.stream = _arrays.current_stream(self.query)

    def inputs(self) -> List[Any]:
        return [
            self.query,
            self.kv_cache,
            self.block_tables,
            self.seq_lens,
            self.cum_seq_lens_q,
            self.sinks,
            self.mask,
            self.sparse_indices,
            self.sparse_topk_lens,
            self.bmm1_scale_tensor,
            self.bmm2_scale_tensor,
        ]

    def ffi_args(self, plan: Optional[bytes] = None) -> Tuple[Any, ...]:
        """The positional arguments of every entry point of src/python/binding.cc, in its order."""
        query, query_code = _arrays.ffi_view(self.query)
        kv_cache, kv_cache_code = _arrays.ffi_view(self.kv_cache)
        out, out_code = (None, -1) if self.out is None else _arrays.ffi_view(self.out)
        return (
            query,
            kv_cache,
            self.block_tables,
            self.seq_lens,
            self.cum_seq_lens_q,
            self.sinks,
            self.mask,
            self.sparse_indices,
            self.sparse_topk_lens,
            self.bmm1_scale_tensor,
            self.bmm2_scale_tensor,
            out,
            self.lse,
            self.workspace,
            self.kv_lora_rank,
            self.qk_rope_head_dim,
            self.qk_nope_head_dim,
            self.max_seq_len,
            self.max_q_len,
            self.sparse_top_k,
            self.bmm1_scale,
            self.bmm2_scale,
            self.skip_softmax,
            self.backend,
            self.enable_pdl,
            self.validate_indices,
            self.stream,
            query_code,
            kv_cache_code,
            out_code,
            plan,
        )

    def workspace_size(self) -> int:
        return int(lib().workspace_size(*self.ffi_args()))

    def ensure_workspace(self) -> None:
        if self.workspace is None:
            size = self.workspace_size()
            if size > 0:
                self.workspace = _arrays.empty(self.query, (size,), "uint8")

    def ensure_outputs(self, return_lse: bool) -> None:
        query_shape = _arrays.shape(self.query)
        if self.out is None:
            out_shape = query_shape[:-1] + (self.kv_lora_rank,)
            self.out = _arrays.empty(self.query, out_shape, _arrays.default_out_dtype(self.query))
        if return_lse and self.lse is None:
            self.lse = _arrays.empty(self.query, query_shape[:-1], "float32")

    def results(self, return_lse: bool) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        out = _arrays.as_framework(self.out, self.query)
        if return_lse:
            return out, _arrays.as_framework(self.lse, self.query)
        return out


def batch_decode(
    query: Tensor,
    kv_cache: Tensor,
    block_tables: Optional[Tensor],
    seq_lens: Tensor,
    *,
    workspace: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
    lse: Optional[Tensor] = None,
    return_lse: bool = False,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    qk_nope_head_dim: int = 128,
    max_seq_len: Optional[int] = None,
    cum_seq_lens_q: Optional[Tensor] = None,
    max_q_len: Optional[int] = None,
    sinks: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    sparse_indices: Optional[Tensor] = None,
    sparse_topk_lens: Optional[Tensor] = None,
    sparse_top_k: int = 0,
    bmm1_scale: Scale = 1.0,
    bmm2_scale: Scale = 1.0,
    skip_softmax_threshold_scale_factor: Optional[float] = None,
    enable_pdl: bool = False,
    validate_indices: bool = False,
    backend: str = "auto",
    stream: Any = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """MLA decode attention over a paged latent KV cache (plan and run in one call).

    Tensors may come from PyTorch, NumPy, CuPy or JAX (anything with DLPack); all live on one
    device. CUDA tensors run on the caller's current stream (PyTorch's current stream for torch
    tensors, CuPy's for cupy arrays), or on ``stream`` when given.

    Args:
        query: ``[B, q_len, H, D]``, or ``[T, H, D]`` with ``cum_seq_lens_q``; bfloat16, float16 or
            float8_e4m3fn (cpu backend: also float32); last dim contiguous. Holds
            ``[q_nope_absorbed (L) | q_pe (R)]`` per head.
        kv_cache: ``[P, page_size, D]`` or ``[P, 1, page_size, D]``, one latent row per token
            (``c_kv`` then ``k_pe``); bfloat16, float16 or float8_e4m3fn (cpu: also float32). Dtype
            pairs (query, kv_cache): equal, or (bfloat16, float8_e4m3fn). page_size a power of two.
            Or DeepSeek-V3.2's ``fp8_ds_mla`` cache with a bfloat16 query: uint8
            ``[P, page_size, 656]`` or ``[P, 1, page_size, 656]``, each token 512 float8_e4m3fn
            values, 4 float32 scales (one per 128 values, multiplied in) and 64 bfloat16 rope
            values (L 512, R 64). Pass the uint8 tensor itself, not a float8 view of it.
        block_tables: ``[B, max_pages]`` int32, physical page of each logical page; or
            ``[B, 2, max_pages]`` (TensorRT-LLM's separate K and V page tables): MLA reads keys and
            values from the same latent row, so row 1 must equal row 0 on every page a request
            reads (``validate_indices`` checks it; the cpu backend always does). None in sparse
            mode.
        seq_lens: ``[B]`` int32, cached tokens per request, including its query tokens.
        workspace: ``[>= workspace_size(...)]`` uint8 on the query's device; reusable, no
            zero-filling needed. Default: allocated per call (pass one for CUDA graphs).
        out: like query with last dim L; bfloat16 or float16. Default: allocated with the query's
            dtype when it is 16-bit, else bfloat16 (NumPy/CuPy, which lack bfloat16: float16).
        lse: ``[B, q_len, H]`` / ``[T, H]`` float32, natural-log log-sum-exp (sink excluded);
            -inf for an empty attended set. Written when given; allocated when ``return_lse``.
        return_lse: return ``(out, lse)`` instead of ``out``.
        kv_lora_rank: L (default 512). qk_rope_head_dim: R (default 64).
        qk_nope_head_dim: informational, must be positive (default 128).
        max_seq_len: host upper bound of seq_lens, >= 0. Default None: the block tables'
            capacity (in sparse mode: no bound).
        cum_seq_lens_q: ``[B + 1]`` int32 (0 first, T last, non-decreasing): ragged queries.
        max_q_len: host upper bound of the ragged query lengths, >= 0. Default None: T.
        sinks: ``[H]`` float32, bfloat16 or float16 per-head sink logits (natural log, not scaled
            by bmm1_scale); passed as given, never converted.
        mask: ``[B, q_len, W]`` / ``[T, W]`` uint32 packed little-endian bits, or uint16 with 2W
            (FlashInfer's layout); bit k of a token's row allows key ``seq_len - n + k``.
        sparse_indices: ``[B, q_len, top_k]`` / ``[T, top_k]`` int32 flat KV slots
            (``page * page_size + offset``), -1 for none. Sparse mode only.
        sparse_topk_lens: ``[B]`` or ``[B, q_len]`` (``[T]`` when ragged) int32: leading entries
            of sparse_indices that count. Optional, sparse mode only.
        sparse_top_k: top_k; > 0 selects sparse mode (default 0: dense).
        bmm1_scale: softmax scale times q/k dequant scales, a float or a 1-element float32 tensor
            read on the device (default 1.0).
        bmm2_scale: v dequant times output scale, same forms (default 1.0).
        skip_softmax_threshold_scale_factor: f > 0 enables skip-softmax (approximate; blocks of 64
            keys). Default None: off.
        enable_pdl: programmatic dependent launch on GPU backends (default False).
        validate_indices: check index tensor contents on the device (default False; the cpu
            backend always checks).
        backend: "auto" (sm90 for CUDA tensors, cpu for host tensors), "sm90" or "cpu".
        stream: a CUDA stream (torch/cupy stream, ``__cuda_stream__`` object or int handle).

    Returns:
        ``out``, or ``(out, lse)`` with ``return_lse``; in the query's framework (for JAX inputs,
        new JAX arrays).

    Raises:
        TypeError: a dtype or dtype pair is not accepted (message names the argument).
        ValueError: any other rejected argument, shape, device, stride, size or index.
    """
    call = _Call(
        query,
        kv_cache,
        block_tables,
        seq_lens,
        workspace=workspace,
        out=out,
        lse=lse,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        qk_nope_head_dim=qk_nope_head_dim,
        max_seq_len=max_seq_len,
        cum_seq_lens_q=cum_seq_lens_q,
        max_q_len=max_q_len,
        sinks=sinks,
        mask=mask,
        sparse_indices=sparse_indices,
        sparse_topk_lens=sparse_topk_lens,
        sparse_top_k=sparse_top_k,
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
        enable_pdl=enable_pdl,
        validate_indices=validate_indices,
        backend=backend,
        stream=stream,
    )
    call.ensure_outputs(return_lse)
    call.ensure_workspace()
    _arrays.sync_jax_inputs(call.inputs())
    lib().decode(*call.ffi_args())
    return call.results(return_lse)


def workspace_size(
    query: Tensor,
    kv_cache: Tensor,
    block_tables: Optional[Tensor],
    seq_lens: Tensor,
    *,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    qk_nope_head_dim: int = 128,
    max_seq_len: Optional[int] = None,
    cum_seq_lens_q: Optional[Tensor] = None,
    max_q_len: Optional[int] = None,
    sinks: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    sparse_indices: Optional[Tensor] = None,
    sparse_topk_lens: Optional[Tensor] = None,
    sparse_top_k: int = 0,
    bmm1_scale: Scale = 1.0,
    bmm2_scale: Scale = 1.0,
    skip_softmax_threshold_scale_factor: Optional[float] = None,
    out: Optional[Tensor] = None,
    lse: Optional[Tensor] = None,
    backend: str = "auto",
) -> int:
    """Bytes of workspace a batch_decode call with these arguments needs. Reads shapes only (no
    tensor contents, no device work) and validates what it reads; arguments as in batch_decode."""
    call = _Call(
        query,
        kv_cache,
        block_tables,
        seq_lens,
        out=out,
        lse=lse,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        qk_nope_head_dim=qk_nope_head_dim,
        max_seq_len=max_seq_len,
        cum_seq_lens_q=cum_seq_lens_q,
        max_q_len=max_q_len,
        sinks=sinks,
        mask=mask,
        sparse_indices=sparse_indices,
        sparse_topk_lens=sparse_topk_lens,
        sparse_top_k=sparse_top_k,
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
        backend=backend,
    )
    return call.workspace_size()


def make_workspace(
    query: Tensor,
    kv_cache: Tensor,
    block_tables: Optional[Tensor],
    seq_lens: Tensor,
    *,
    min_bytes: int = 0,
    **kwargs: Any,
) -> Tensor:
    """An uninitialized uint8 workspace of ``max(workspace_size(...), min_bytes)`` bytes, in the
    query's framework and on its device (for JAX: NumPy on the host, PyTorch/CuPy on CUDA).
    Keyword arguments as in workspace_size; ``min_bytes`` sizes one buffer for the largest batch
    an engine will run (e.g. before capturing CUDA graphs)."""
    size = max(workspace_size(query, kv_cache, block_tables, seq_lens, **kwargs), int(min_bytes))
    return _arrays.empty(query, (size,), "uint8")


class Plan:
    """The work split of one decode step, made by :func:`plan` and consumed by :meth:`run` for
    every layer of the step (each layer has its own query and KV cache; block tables, seq_lens,
    query lengths, workspace and backend are the plan's).

    On GPU backends the split lives in the workspace: do not hand the workspace to another call
    between plan() and the last run() of the step.
    """

    def __init__(self, call_kwargs: Dict[str, Any], plan_bytes: bytes, workspace: Any) -> None:
        self._kwargs = call_kwargs
        self._bytes = plan_bytes
        self.workspace = workspace

    def run(
        self,
        query: Tensor,
        kv_cache: Tensor,
        *,
        out: Optional[Tensor] = None,
        lse: Optional[Tensor] = None,
        return_lse: bool = False,
        **per_layer: Any,
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Attention for one layer with this plan. ``query`` and ``kv_cache`` must have the planned
        shapes; ``out``, ``lse``, ``return_lse`` as in batch_decode. Keyword arguments that may
        differ per layer (default: the plan's): sinks, mask, sparse_indices, sparse_topk_lens,
        bmm1_scale, bmm2_scale, skip_softmax_threshold_scale_factor, enable_pdl, stream."""
        unknown = sorted(set(per_layer) - set(_PER_LAYER))
        if unknown:
            raise TypeError(
                f"{unknown[0]}: not a per-layer argument of Plan.run (fixed by plan(); "
                f"per-layer: {', '.join(_PER_LAYER)})"
            )
        kwargs = {**self._kwargs, **per_layer}
        call = _Call(
            query, kv_cache, workspace=self.workspace, out=out, lse=lse, **kwargs
        )
        call.ensure_outputs(return_lse)
        _arrays.sync_jax_inputs(call.inputs())
        lib().run(*call.ffi_args(self._bytes))
        return call.results(return_lse)

    def __repr__(self) -> str:
        backend = self._kwargs.get("backend", "auto")
        return f"mla_decode.Plan(backend={backend!r}, {len(self._bytes)} bytes)"


def plan(
    query: Tensor,
    kv_cache: Tensor,
    block_tables: Optional[Tensor],
    seq_lens: Tensor,
    *,
    workspace: Optional[Tensor] = None,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    qk_nope_head_dim: int = 128,
    max_seq_len: Optional[int] = None,
    cum_seq_lens_q: Optional[Tensor] = None,
    max_q_len: Optional[int] = None,
    sinks: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    sparse_indices: Optional[Tensor] = None,
    sparse_topk_lens: Optional[Tensor] = None,
    sparse_top_k: int = 0,
    bmm1_scale: Scale = 1.0,
    bmm2_scale: Scale = 1.0,
    skip_softmax_threshold_scale_factor: Optional[float] = None,
    enable_pdl: bool = False,
    validate_indices: bool = False,
    backend: str = "auto",
    stream: Any = None,
) -> Plan:
    """Plans one decode step (once per step, before the layers); returns a :class:`Plan` whose
    ``run`` computes each layer. Arguments as in batch_decode, without out/lse; ``query`` and
    ``kv_cache`` give the shapes (any layer's). The plan depends on seq_lens, the query lengths and
    the shapes, is written into ``workspace`` on GPU backends (on the stream, no host sync) and
    validates every argument."""
    kwargs = dict(
        block_tables=block_tables,
        seq_lens=seq_lens,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        qk_nope_head_dim=qk_nope_head_dim,
        max_seq_len=max_seq_len,
        cum_seq_lens_q=cum_seq_lens_q,
        max_q_len=max_q_len,
        sinks=sinks,
        mask=mask,
        sparse_indices=sparse_indices,
        sparse_topk_lens=sparse_topk_lens,
        sparse_top_k=sparse_top_k,
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
        enable_pdl=enable_pdl,
        validate_indices=validate_indices,
        backend=backend,
        stream=stream,
    )
    call = _Call(query, kv_cache, workspace=workspace, **kwargs)
    call.ensure_workspace()
    _arrays.sync_jax_inputs(call.inputs())
    plan_bytes = bytes(lib().plan(*call.ffi_args()))
    return Plan(kwargs, plan_bytes, call.workspace)


def run(
    plan: Plan,
    query: Tensor,
    kv_cache: Tensor,
    *,
    out: Optional[Tensor] = None,
    lse: Optional[Tensor] = None,
    return_lse: bool = False,
    **per_layer: Any,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """``plan.run(query, kv_cache, ...)``: one layer of a planned decode step."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: expected a mla_decode.Plan, got {type(plan).__name__}")
    return plan.run(query, kv_cache, out=out, lse=lse, return_lse=return_lse, **per_layer)
