"""Every rule family of docs/contract.md section 5 through Python: the exception type (TypeError for dtypes,
ValueError for everything else) and a message that starts with the argument's name.

Each case starts from a valid call and breaks one thing. Device rules use fake_device.DeviceTensor
(a host array presented as CUDA memory), refused before any memory is touched.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import numpy as np
import pytest

import mla_decode
from cases import Case, make_case
from fake_device import DeviceTensor
from tolerance import assert_lse_close, assert_out_close

POSITIONAL = ("query", "kv_cache", "block_tables", "seq_lens")


def base_case(rng: np.random.Generator) -> Case:
    return make_case(rng, batch=2, q_len=2, heads=4, page_size=4, seq_lens=[3, 9])


def call_args(case: Case, change: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    positional = dict(zip(POSITIONAL, case.args()))
    keywords = case.kwargs()
    for name, value in change.items():
        (positional if name in POSITIONAL else keywords)[name] = value
    return tuple(positional[n] for n in POSITIONAL), keywords


def expect_error(exc: type, name: str, case: Case, fn: Callable = None, **change: Any) -> str:
    fn = fn or mla_decode.batch_decode
    args, kwargs = call_args(case, change)
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert type(info.value) is exc, f"{type(info.value).__name__}: {message}"
    assert message.startswith(name), message
    return message


def strided_last_dim(a: np.ndarray) -> np.ndarray:
    """`a` with its last dim at stride 2 (same shape and values)."""
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


def bf16(a: np.ndarray) -> np.ndarray:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return np.asarray(a).astype(ml_dtypes.bfloat16)


def huge(shape: tuple, dtype: Any) -> np.ndarray:
    """A view of `shape` over a few bytes (zero strides except the last dim), never read."""
    base = np.zeros(shape[-1], dtype)
    strides = (0,) * (len(shape) - 1) + (base.itemsize,)
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides)


# (rule, exception, argument named, change: rng, case -> {argument: new value}).
CASES = [
    # Ranks.
    ("rank query", ValueError, "query", lambda r, c: dict(query=c.query[0])),
    ("rank query > 4", ValueError, "query", lambda r, c: dict(query=c.query[None])),
    ("rank kv_cache", ValueError, "kv_cache", lambda r, c: dict(kv_cache=c.kv_cache[0])),
    ("rank block_tables", ValueError, "block_tables",
     lambda r, c: dict(block_tables=c.block_tables[0])),
    ("rank block_tables 4", ValueError, "block_tables",
     lambda r, c: dict(block_tables=c.block_tables[:, None, None])),
    ("block_tables K/V rows", ValueError, "block_tables",
     lambda r, c: dict(block_tables=np.stack([c.block_tables] * 3, axis=1))),
    ("rank seq_lens", ValueError, "seq_lens", lambda r, c: dict(seq_lens=c.seq_lens[None])),
    # Shapes and sizes.
    ("query last dim", ValueError, "query", lambda r, c: dict(query=c.query[..., :-1].copy())),
    ("kv_cache last dim", ValueError, "kv_cache",
     lambda r, c: dict(kv_cache=c.kv_cache[..., :-1].copy())),
    ("kv_cache 4d heads", ValueError, "kv_cache",
     lambda r, c: dict(kv_cache=np.stack([c.kv_cache, c.kv_cache], axis=1))),
    ("page_size power of two", ValueError, "kv_cache",
     lambda r, c: dict(kv_cache=c.kv_cache[:, :3].copy())),
    ("seq_lens length", ValueError, "seq_lens", lambda r, c: dict(seq_lens=c.seq_lens[:1].copy())),
    ("block_tables batch", ValueError, "block_tables",
     lambda r, c: dict(block_tables=c.block_tables[:1].copy())),
    ("kv_lora_rank", ValueError, "kv_lora_rank", lambda r, c: dict(kv_lora_rank=0)),
    ("qk_rope_head_dim", ValueError, "qk_rope_head_dim", lambda r, c: dict(qk_rope_head_dim=-16)),
    # The fp8_ds_mla cache: uint8 [P, page_size, 656] with a bfloat16 query, L 512, R 64.
    ("fp8_ds_mla query dtype", TypeError, "kv_cache",
     lambda r, c: dict(kv_cache=np.zeros(c.kv_cache.shape[:-1] + (656,), np.uint8))),
    ("fp8_ds_mla head dims", ValueError, "kv_cache",
     lambda r, c: dict(query=bf16(c.query),
                       kv_cache=np.zeros(c.kv_cache.shape[:-1] + (656,), np.uint8))),
    ("fp8_ds_mla row bytes", ValueError, "kv_cache",
     lambda r, c: dict(query=bf16(np.zeros(c.query.shape[:-1] + (576,))), kv_lora_rank=512,
                       qk_rope_head_dim=64,
                       kv_cache=np.zeros(c.kv_cache.shape[:-1] + (576,), np.uint8))),
    ("qk_nope_head_dim", ValueError, "qk_nope_head_dim", lambda r, c: dict(qk_nope_head_dim=0)),
    ("max_seq_len above capacity", ValueError, "max_seq_len", lambda r, c: dict(max_seq_len=10**6)),
    ("max_seq_len beyond int32", ValueError, "max_seq_len", lambda r, c: dict(max_seq_len=2**40)),
    # Dtypes and dtype pairs.
    ("dtype query", TypeError, "query", lambda r, c: dict(query=c.query.astype(np.float64))),
    ("dtype kv_cache", TypeError, "kv_cache",
     lambda r, c: dict(kv_cache=np.zeros(c.kv_cache.shape, np.int32))),
    ("dtype pair", TypeError, "kv_cache", lambda r, c: dict(query=c.query.astype(np.float16))),
    ("dtype seq_lens", TypeError, "seq_lens", lambda r, c: dict(seq_lens=c.seq_lens.astype(np.int64))),
    ("dtype block_tables", TypeError, "block_tables",
     lambda r, c: dict(block_tables=c.block_tables.astype(np.int64))),
    # Devices (all tensors of a call on the query's device; backend and device agree).
    ("device kv_cache", ValueError, "kv_cache", lambda r, c: dict(kv_cache=DeviceTensor(c.kv_cache))),
    ("device block_tables", ValueError, "block_tables",
     lambda r, c: dict(block_tables=DeviceTensor(c.block_tables))),
    ("device seq_lens", ValueError, "seq_lens", lambda r, c: dict(seq_lens=DeviceTensor(c.seq_lens))),
    ("device sinks", ValueError, "sinks",
     lambda r, c: dict(sinks=DeviceTensor(np.zeros(c.num_heads, np.float32)))),
    ("backend sm90 with host tensors", ValueError, "query", lambda r, c: dict(backend="sm90")),
    ("backend cpu with CUDA tensors", ValueError, "query",
     lambda r, c: dict(backend="cpu", query=DeviceTensor(c.query),
                       out=DeviceTensor(np.zeros(c.query.shape[:-1] + (32,), np.float16)),
                       workspace=DeviceTensor(np.zeros(1 << 20, np.uint8)))),
    # Strides.
    ("stride query", ValueError, "query", lambda r, c: dict(query=strided_last_dim(c.query))),
    ("stride kv_cache", ValueError, "kv_cache",
     lambda r, c: dict(kv_cache=strided_last_dim(c.kv_cache))),
    ("stride out", ValueError, "out",
     lambda r, c: dict(out=strided_last_dim(np.zeros(c.query.shape[:-1] + (32,), np.float16)))),
    ("stride seq_lens", ValueError, "seq_lens", lambda r, c: dict(seq_lens=strided_last_dim(c.seq_lens))),
    ("stride out zero", ValueError, "out",
     lambda r, c: dict(out=huge(c.query.shape[:-1] + (32,), np.float16))),
    ("stride lse zero", ValueError, "lse",
     lambda r, c: dict(lse=huge(c.query.shape[:-1], np.float32))),
    # Sizes that overflow int32 index math.
    ("int32 kv slots", ValueError, "kv_cache",
     lambda r, c: dict(kv_cache=huge((2**20, 2**12, 48), np.float32))),
    ("int32 block_tables capacity", ValueError, "block_tables",
     lambda r, c: dict(block_tables=huge((2, 2**30), np.int32))),
    ("int32 query rows", ValueError, "query",
     lambda r, c: dict(query=huge((2, 2**16, 2**15, 48), np.float32),
                       out=huge((2, 2**16, 2**15, 32), np.float16))),
    # Outputs.
    ("out shape", ValueError, "out",
     lambda r, c: dict(out=np.zeros(c.query.shape[:-1] + (33,), np.float16))),
    ("out rank", ValueError, "out", lambda r, c: dict(out=np.zeros((2, 2, 4 * 32), np.float16))),
    ("out dtype", TypeError, "out",
     lambda r, c: dict(out=np.zeros(c.query.shape[:-1] + (32,), np.float32))),
    ("lse shape", ValueError, "lse", lambda r, c: dict(lse=np.zeros((2, 2, 5), np.float32))),
    ("lse dtype", TypeError, "lse", lambda r, c: dict(lse=np.zeros((2, 2, 4), np.float16))),
    # Sinks.
    ("sinks length", ValueError, "sinks", lambda r, c: dict(sinks=np.zeros(5, np.float32))),
    ("sinks rank", ValueError, "sinks", lambda r, c: dict(sinks=np.zeros((1, 4), np.float32))),
    ("sinks dtype", TypeError, "sinks", lambda r, c: dict(sinks=np.zeros(4, np.float64))),
    # Scales and skip-softmax.
    ("bmm1_scale elements", ValueError, "bmm1_scale",
     lambda r, c: dict(bmm1_scale=np.ones(2, np.float32))),
    ("bmm2_scale dtype", TypeError, "bmm2_scale", lambda r, c: dict(bmm2_scale=np.ones(1, np.float64))),
    ("skip-softmax factor", ValueError, "skip_softmax_threshold_scale_factor",
     lambda r, c: dict(skip_softmax_threshold_scale_factor=-1.0)),
    # Mask.
    ("mask dtype", TypeError, "mask", lambda r, c: dict(mask=np.zeros((2, 2, 1), np.int32))),
    ("mask words", ValueError, "mask", lambda r, c: dict(mask=np.zeros((2, 2, 0), np.uint32))),
    ("mask uint16 odd words", ValueError, "mask", lambda r, c: dict(mask=np.zeros((2, 2, 1), np.uint16))),
    ("mask shape", ValueError, "mask", lambda r, c: dict(mask=np.zeros((2, 3, 1), np.uint32))),
    # cum_seq_lens_q and max_q_len.
    ("max_q_len dense", ValueError, "max_q_len", lambda r, c: dict(max_q_len=3)),
    ("cum_seq_lens_q length", ValueError, "cum_seq_lens_q",
     lambda r, c: dict(query=c.query.reshape(4, 4, 48), cum_seq_lens_q=np.array([0, 4], np.int32))),
    ("cum_seq_lens_q dtype", TypeError, "cum_seq_lens_q",
     lambda r, c: dict(query=c.query.reshape(4, 4, 48), cum_seq_lens_q=np.array([0, 2, 4]))),
    ("cum_seq_lens_q contents", ValueError, "cum_seq_lens_q",
     lambda r, c: dict(query=c.query.reshape(4, 4, 48),
                       cum_seq_lens_q=np.array([0, 3, 2], np.int32))),
    ("max_q_len ragged", ValueError, "max_q_len",
     lambda r, c: dict(query=c.query.reshape(4, 4, 48),
                       cum_seq_lens_q=np.array([0, 2, 4], np.int32), max_q_len=0)),
    # Sparse tensors.
    ("sparse with block_tables", ValueError, "block_tables",
     lambda r, c: dict(sparse_top_k=4, sparse_indices=np.zeros((2, 2, 4), np.int32))),
    ("sparse without indices", ValueError, "sparse_indices",
     lambda r, c: dict(block_tables=None, sparse_top_k=4)),
    ("sparse indices top_k", ValueError, "sparse_indices",
     lambda r, c: dict(block_tables=None, sparse_top_k=4,
                       sparse_indices=np.zeros((2, 2, 5), np.int32))),
    ("sparse indices dtype", TypeError, "sparse_indices",
     lambda r, c: dict(block_tables=None, sparse_top_k=4, sparse_indices=np.zeros((2, 2, 4)))),
    ("sparse indices in dense mode", ValueError, "sparse_indices",
     lambda r, c: dict(sparse_indices=np.zeros((2, 2, 4), np.int32))),
    ("sparse topk lens shape", ValueError, "sparse_topk_lens",
     lambda r, c: dict(block_tables=None, sparse_top_k=4,
                       sparse_indices=np.zeros((2, 2, 4), np.int32),
                       sparse_topk_lens=np.zeros(3, np.int32))),
    ("sparse index outside the pool", ValueError, "sparse_indices",
     lambda r, c: dict(block_tables=None, sparse_top_k=1,
                       sparse_indices=np.full((2, 2, 1), 10**6, np.int32))),
    ("sparse_top_k negative", ValueError, "sparse_top_k", lambda r, c: dict(sparse_top_k=-1)),
    # Index contents (the cpu backend always checks them).
    ("block_tables entry", ValueError, "block_tables",
     lambda r, c: dict(block_tables=np.full_like(c.block_tables, 10**6))),
    ("block_tables K/V rows differ", ValueError, "block_tables",
     lambda r, c: dict(block_tables=np.stack([c.block_tables, c.block_tables[::-1]], axis=1))),
    ("seq_lens negative", ValueError, "seq_lens", lambda r, c: dict(seq_lens=np.array([-1, 3], np.int32))),
    ("seq_lens above capacity", ValueError, "seq_lens",
     lambda r, c: dict(seq_lens=np.array([3, 10**5], np.int32))),
    # Backend names.
    ("backend unknown", ValueError, "backend", lambda r, c: dict(backend="flash")),
    ("backend trtllm-gen", ValueError, "backend", lambda r, c: dict(backend="trtllm-gen")),
    # Checked on the Python side, same form.
    ("query not a tensor", TypeError, "query", lambda r, c: dict(query=c.query.tolist())),
    ("kv_lora_rank not an int", TypeError, "kv_lora_rank", lambda r, c: dict(kv_lora_rank=32.0)),
    ("bmm1_scale not a number", TypeError, "bmm1_scale", lambda r, c: dict(bmm1_scale="1")),
    ("stream", TypeError, "stream", lambda r, c: dict(stream="default")),
]


@pytest.mark.parametrize("rule,exc,name,change", CASES, ids=[c[0] for c in CASES])
def test_rule(rng, rule, exc, name, change):
    case = base_case(rng)
    expect_error(exc, name, case, **change(rng, case))


def test_workspace_too_small_wrong_dtype_and_rank(rng):
    case = base_case(rng)
    size = mla_decode.workspace_size(*case.args(), **case.kwargs())
    assert size > 0
    message = expect_error(ValueError, "workspace", case, workspace=np.zeros(size - 1, np.uint8))
    assert str(size) in message
    expect_error(TypeError, "workspace", case, workspace=np.zeros(size, np.int32))
    expect_error(ValueError, "workspace", case, workspace=np.zeros((1, size), np.uint8))


def test_cuda_tensors_without_the_sm90_backend_are_refused(rng):
    if "sm90" in mla_decode.available_backends():
        pytest.skip("fake CUDA tensors would reach the sm90 kernels")
    # A call the sm90 backend supports (DeepSeek head dims, fp16), so only its absence
    # (no CUDA in the build, or no GPU) is left to report.
    case = make_case(rng, batch=2, heads=4, kv_lora_rank=512, rope_dim=64, page_size=64)
    case.query, case.kv_cache = case.query.astype(np.float16), case.kv_cache.astype(np.float16)
    on_cuda = {n: DeviceTensor(t) for n, t in zip(POSITIONAL, case.args())}
    on_cuda["out"] = DeviceTensor(np.zeros(case.query.shape[:-1] + (512,), np.float16))
    on_cuda["workspace"] = DeviceTensor(np.zeros(1 << 20, np.uint8))
    expect_error(ValueError, "backend", case, **on_cuda)


def test_blackwell_backend_names_list_ours(rng):
    case = base_case(rng)
    for name in ("trtllm-gen", "xqa", "cute-dsl"):
        message = expect_error(ValueError, "backend", case, backend=name)
        assert "Blackwell" in message and "'auto', 'sm90'" in message and "'cpu'" in message


def test_messages_are_the_libraries_verbatim(rng):
    # The C++ message reaches Python unchanged: no prefix, no appended backtrace.
    case = base_case(rng)
    message = expect_error(ValueError, "query", case, query=case.query[..., :-1].copy())
    assert message == (
        "query: expected last dim (kv_lora_rank 32 + qk_rope_head_dim 16) = 48, got 47 "
        "(shape [2, 2, 4, 47])"
    )


def test_plan_and_workspace_size_validate_too(rng):
    case = base_case(rng)
    expect_error(TypeError, "query", case, fn=mla_decode.workspace_size,
                 query=case.query.astype(np.float64))
    expect_error(ValueError, "kv_cache", case, fn=mla_decode.plan, kv_cache=case.kv_cache[0])


def read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("name", ["out", "lse", "workspace"])
def test_read_only_outputs_and_workspace_are_refused(rng, name):
    # NumPy itself would raise BufferError when the array is handed over through DLPack.
    case = base_case(rng)
    size = mla_decode.workspace_size(*case.args(), **case.kwargs())
    given = dict(out=np.zeros(case.query.shape[:-1] + (32,), np.float16),
                 lse=np.zeros(case.query.shape[:-1], np.float32),
                 workspace=np.zeros(size, np.uint8))
    message = expect_error(ValueError, f"{name}: expected a writable array", case,
                           **{name: read_only(given[name])})
    assert "read-only NumPy array" in message
    if name == "workspace":  # plan() takes it too
        with pytest.raises(ValueError, match="^workspace: expected a writable array"):
            mla_decode.plan(*case.args(), workspace=read_only(given[name]), **case.kwargs())


@pytest.mark.parametrize("name", ["query", "kv_cache", "block_tables", "seq_lens", "bmm1_scale"])
def test_read_only_inputs_are_refused_by_name(rng, name):
    case = base_case(rng)
    given = dict(zip(POSITIONAL, case.args()), bmm1_scale=np.array([0.125], np.float32))[name]
    message = expect_error(ValueError, f"{name}: expected a writable array", case,
                           **{name: read_only(given)})
    assert "x.copy()" in message


DEFAULT_BOUNDS = {"max_seq_len": "the block tables' capacity", "max_q_len": "the query tokens T"}


@pytest.mark.parametrize("fn", [mla_decode.batch_decode, mla_decode.workspace_size,
                                mla_decode.plan])
@pytest.mark.parametrize("name", sorted(DEFAULT_BOUNDS))
def test_negative_bounds_are_refused(rng, fn, name):
    # None is the default; -1 is the C++ API's spelling of it, not a Python value.
    case = make_case(rng, ragged_q_lens=[1, 2], heads=4, page_size=4, seq_lens=[3, 9])
    for value in (-1, -7):
        message = expect_error(ValueError, name, case, fn=fn, **{name: value})
        assert message == (
            f"{name}: expected None ({DEFAULT_BOUNDS[name]}) or a bound >= 0, got {value}"
        )
    fn(*case.args(), **case.kwargs(), **{name: None})
    fn(*case.args(), **case.kwargs(), **{name: 9 if name == "max_seq_len" else 2})


@pytest.mark.parametrize("name", ["bmm1_scale", "bmm2_scale"])
def test_scale_tensor_messages_name_the_python_argument(rng, name):
    case = base_case(rng)
    for bad, exc in ((np.ones(2, np.float32), ValueError), (np.ones(1, np.float64), TypeError)):
        message = expect_error(exc, f"{name} (tensor): expected", case, **{name: bad})
        assert "_tensor" not in message, message


def test_jax_outputs_are_refused(rng):
    jnp = pytest.importorskip("jax.numpy")
    case = base_case(rng)
    expect_error(TypeError, "out", case, out=jnp.zeros(case.query.shape[:-1] + (32,), jnp.float16))


# ---- out and lse apart from every input, the workspace and each other (docs/contract.md, 3) ----


def overlapping(input_: np.ndarray, out_shape: tuple, out_dtype: Any) -> Tuple[np.ndarray, ...]:
    """(a copy of `input_`, an out/lse view) in one buffer: the view starts at the copy's last 4
    bytes, so the two overlap while both stay valid."""
    out_bytes = int(np.prod(out_shape)) * np.dtype(out_dtype).itemsize
    raw = np.zeros(input_.nbytes + out_bytes, np.uint8)
    copy = raw[: input_.nbytes].view(input_.dtype).reshape(input_.shape)
    copy[...] = input_
    start = input_.nbytes - 4
    view = raw[start : start + out_bytes].view(out_dtype).reshape(out_shape)
    return copy, view


@pytest.mark.parametrize("name", ["query", "kv_cache", "block_tables", "seq_lens", "sinks",
                                  "mask", "bmm1_scale", "workspace"])
@pytest.mark.parametrize("output", ["out", "lse"])
def test_outputs_must_not_overlap_an_input(rng, name, output):
    case = base_case(rng)
    inputs = dict(sinks=np.zeros(4, np.float32), mask=np.full((2, 2, 1), 3, np.uint32),
                  bmm1_scale=np.array([0.125], np.float32),
                  workspace=np.zeros(mla_decode.workspace_size(*case.args(), **case.kwargs()),
                                     np.uint8))
    given = dict(zip(POSITIONAL, case.args()), **inputs)[name]
    shape, dtype = ((case.query.shape[:-1] + (32,), np.float16) if output == "out"
                    else (case.query.shape[:-1], np.float32))
    copy, view = overlapping(given, shape, dtype)
    before = copy.copy()
    change = {name: copy, output: view}
    if output == "lse":
        change["return_lse"] = True
    message = expect_error(ValueError, output, case, **change)
    named = "bmm1_scale (tensor)" if name == "bmm1_scale" else name  # a tensor given as bmm1_scale
    assert message.startswith(f"{output}: overlaps {named} (bytes [0x"), message
    np.testing.assert_array_equal(copy, before)


def test_out_and_lse_must_not_overlap(rng):
    case = base_case(rng)
    out = np.zeros(case.query.shape[:-1] + (32,), np.float16)
    lse = out.view(np.float32)[..., 0]  # the first 4 bytes of each out row
    message = expect_error(ValueError, "lse", case, out=out, lse=lse)
    assert message.startswith("lse: overlaps out (bytes [0x")


def test_adjacent_outputs_are_accepted(rng):
    case = base_case(rng)
    lead = case.query.shape[:-1]
    raw = np.zeros(case.query.nbytes + int(np.prod(lead)) * (4 + 32 * 2), np.uint8)
    query = raw[: case.query.nbytes].view(np.float32).reshape(case.query.shape)
    query[...] = case.query
    lse = raw[case.query.nbytes : case.query.nbytes + 4 * int(np.prod(lead))].view(np.float32)
    out = raw[case.query.nbytes + lse.nbytes :].view(np.float16).reshape(lead + (32,))
    mla_decode.batch_decode(query, *case.args()[1:], out=out, lse=lse.reshape(lead),
                            **case.kwargs())
    ref_out, ref_lse = case.reference()
    assert_out_close(out, ref_out)
    assert_lse_close(lse.reshape(lead), ref_lse)
