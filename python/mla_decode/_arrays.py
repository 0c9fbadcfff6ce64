"""Framework-neutral tensor helpers.

The C++ module accepts any DLPack tensor (tvm-ffi converts PyTorch, NumPy, CuPy and JAX arrays).
What this file adds is what DLPack does not cover: which framework and device a tensor belongs to,
allocating outputs and workspaces in that framework, dtypes some frameworks cannot export through
DLPack (float8 from PyTorch, ml_dtypes' bfloat16/float8 from NumPy), and stream handles.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

import numpy as np

# DLPack device types.
DL_CPU, DL_CUDA, DL_CUDA_HOST = 1, 2, 3

# Dtypes passed as a same-width unsigned view plus their DLPack type code, because a framework
# cannot export them through DLPack (every float8 from PyTorch; bfloat16/float8 from NumPy, where
# ml_dtypes provides them). The C++ side restores the real type from the code.
_VIEWED_DTYPES = {
    "bfloat16": (4, 16),
    "float8_e4m3fn": (10, 8),
    "float8_e4m3fnuz": (11, 8),
    "float8_e5m2": (12, 8),
    "float8_e5m2fnuz": (13, 8),
}

SIXTEEN_BIT_FLOATS = ("bfloat16", "float16")


def is_tensor(x: Any) -> bool:
    return hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")


def framework(x: Any) -> str:
    """'torch', 'numpy', 'cupy', 'jax', or 'other' (any other DLPack producer)."""
    root = type(x).__module__.split(".")[0]
    if root == "torch":
        return "torch"
    if root == "numpy":
        return "numpy"
    if root == "cupy":
        return "cupy"
    if root in ("jax", "jaxlib"):
        return "jax"
    return "other"


def device(x: Any) -> Tuple[int, int]:
    """(DLPack device type, device id)."""
    device_type, device_id = x.__dlpack_device__()
    return int(device_type), int(device_id)


def is_cuda(x: Any) -> bool:
    return device(x)[0] == DL_CUDA


def dtype_name(x: Any) -> str:
    """The element type's name without framework prefix, e.g. 'bfloat16', 'float8_e4m3fn'."""
    dt = x.dtype
    name = dt.name if isinstance(dt, np.dtype) else str(dt)
    return name.rsplit(".", 1)[-1]


def shape(x: Any) -> Tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def ffi_view(x: Any) -> Tuple[Any, int]:
    """What to hand the C++ module for tensor `x`, and the DLPack type code it really holds
    (-1: the view's own dtype is right)."""
    name = dtype_name(x)
    if name not in _VIEWED_DTYPES:
        return x, -1
    code, bits = _VIEWED_DTYPES[name]
    fw = framework(x)
    if fw == "torch" and name != "bfloat16":
        import torch

        return x.view(torch.uint8), code
    if fw == "numpy":
        return x.view(np.uint8 if bits == 8 else np.uint16), code
    return x, -1


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        try:
            import ml_dtypes  # NumPy has no bfloat16; ml_dtypes (a JAX dependency) provides it
        except ImportError as e:
            raise TypeError(
                "out: a bfloat16 NumPy output needs the ml_dtypes package (pip install "
                "ml_dtypes); or pass out= as a float16 array"
            ) from e
        return ml_dtypes.bfloat16
    return np.dtype(name)


def _writable_cuda_framework(like: Any) -> str:
    for name in ("torch", "cupy"):
        if name in sys.modules:
            return name
    for name in ("torch", "cupy"):
        try:
            __import__(name)
            return name
        except ImportError:
            pass
    raise TypeError(
        f"out: allocating CUDA outputs for a {type(like).__name__} needs PyTorch or CuPy; pass "
        "out= (and lse=, workspace=) from a framework with writable arrays"
    )


def empty(like: Any, shape_: Tuple[int, ...], dtype: str) -> Any:
    """An uninitialized tensor of `dtype` in `like`'s framework and on its device. JAX arrays are
    immutable: for them this allocates in NumPy (host) or PyTorch/CuPy (CUDA); as_framework()
    converts the result back."""
    fw = _allocating_framework(like)
    device_type, device_id = device(like)
    if fw == "torch":
        import torch

        if hasattr(like, "device") and framework(like) == "torch":
            dev = like.device
        else:
            dev = torch.device("cuda", device_id) if device_type == DL_CUDA else torch.device("cpu")
        return torch.empty(shape_, dtype=getattr(torch, dtype), device=dev)
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(device_id):
            return cupy.empty(shape_, dtype=dtype)
    if device_type not in (DL_CPU, DL_CUDA_HOST):
        raise TypeError(
            f"out: cannot allocate on DLPack device type {device_type} for a {type(like).__name__}; "
            "pass out= (and lse=, workspace=) explicitly"
        )
    return np.empty(shape_, dtype=_numpy_dtype(dtype))


def _allocating_framework(like: Any) -> str:
    """The framework empty() allocates in for tensors like `like`."""
    fw = framework(like)
    if fw in ("jax", "other"):
        host = device(like)[0] in (DL_CPU, DL_CUDA_HOST)
        return "numpy" if host else _writable_cuda_framework(like)
    return fw


def bfloat16_or_float16(like: Any) -> str:
    """bfloat16 where the allocating framework has it (PyTorch; NumPy through ml_dtypes), else
    float16 (CuPy has no bfloat16)."""
    return "float16" if _allocating_framework(like) == "cupy" else "bfloat16"


def is_numpy_bfloat16(x: Any) -> bool:
    """A NumPy array of ml_dtypes' bfloat16, which NumPy cannot export through DLPack."""
    return framework(x) == "numpy" and dtype_name(x) == "bfloat16"


def full_int32(like: Any, shape_: Tuple[int, ...], value: int) -> Any:
    """An int32 tensor of `value` in `like`'s framework and on its device."""
    x = empty(like, shape_, "int32")
    if framework(x) == "torch":
        x.fill_(value)
    else:
        x.fill(value)  # NumPy, CuPy
    return x


def reshaped(x: Any, shape_: Tuple[int, ...], name: str, *, view: bool) -> Any:
    """`x` reshaped to `shape_`; with `view`, sharing x's memory (ValueError naming `name` when the
    strides do not allow it), else possibly a copy (for inputs)."""
    fw = framework(x)
    if fw == "torch":
        if not view:
            return x.reshape(shape_)
        try:
            return x.view(shape_)
        except RuntimeError as e:
            raise ValueError(
                f"{name}: expected a tensor viewable as {list(shape_)}, got shape "
                f"{list(x.shape)} with strides {list(x.stride())}"
            ) from e
    if fw == "numpy":
        if not view:
            return np.reshape(x, shape_)
        try:
            try:
                return np.reshape(x, shape_, copy=False)  # NumPy >= 2.1: raises, never copies
            except TypeError:
                result = x.view()
                result.shape = shape_  # older NumPy: the same guarantee
                return result
        except (ValueError, AttributeError) as e:
            raise ValueError(
                f"{name}: expected an array viewable as {list(shape_)}, got shape "
                f"{list(x.shape)} with strides {list(x.strides)}"
            ) from e
    if view and not getattr(getattr(x, "flags", None), "c_contiguous", False):
        raise ValueError(f"{name}: expected a contiguous array viewable as {list(shape_)}")
    return x.reshape(shape_)


def default_out_dtype(query: Any) -> str:
    """The contract (docs/contract.md, section 3): the query's dtype when it is 16-bit, else
    bfloat16. NumPy and CuPy have no native bfloat16, so float16 is their default for float32/float8
    queries."""
    name = dtype_name(query)
    if name in SIXTEEN_BIT_FLOATS:
        return name
    return "float16" if framework(query) in ("numpy", "cupy") else "bfloat16"


def as_framework(result: Any, like: Any) -> Any:
    """`result` as an array of `like`'s framework: converts only for JAX inputs."""
    if framework(like) != "jax" or framework(result) == "jax":
        return result
    import jax
    import jax.numpy as jnp

    if framework(result) == "numpy":
        return jnp.asarray(result)
    return jax.dlpack.from_dlpack(result)


def is_immutable(x: Any) -> bool:
    return framework(x) == "jax"


def is_read_only(x: Any) -> bool:
    """A NumPy array that may not be written (``flags.writeable`` False: a broadcast view, a
    buffer of bytes, an array locked by its owner); NumPy refuses to export those for writing."""
    return framework(x) == "numpy" and not x.flags.writeable


def sync_jax_inputs(tensors: Any) -> None:
    """JAX computes asynchronously on its own streams: wait for JAX inputs before a launch."""
    for t in tensors:
        if t is not None and framework(t) == "jax" and hasattr(t, "block_until_ready"):
            t.block_until_ready()


def stream_handle(stream: Any) -> Optional[int]:
    """A cudaStream_t as an integer from an int, a torch.cuda.Stream, a cupy Stream, or any object
    with the __cuda_stream__ protocol; None stays None (the caller's current stream)."""
    if stream is None:
        return None
    if isinstance(stream, bool):
        raise TypeError("stream: expected a CUDA stream or its handle as an int, got bool")
    if isinstance(stream, (int, np.integer)):
        return int(stream)
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    if hasattr(stream, "ptr"):  # cupy.cuda.Stream
        return int(stream.ptr)
    raise TypeError(
        "stream: expected a CUDA stream (torch.cuda.Stream, cupy.cuda.Stream, an object with "
        f"__cuda_stream__) or its handle as an int, got {type(stream).__name__}"
    )


def current_stream(x: Any) -> Optional[int]:
    """The current stream of `x`'s framework on `x`'s CUDA device, where tvm-ffi does not pick it
    up by itself (it does for PyTorch). None: leave it to tvm-ffi's environment stream."""
    if framework(x) == "cupy" and is_cuda(x):
        import cupy

        with cupy.cuda.Device(device(x)[1]):
            return int(cupy.cuda.get_current_stream().ptr)
    return None


def byte_view(x: Any) -> Any:
    """A contiguous tensor's memory as a flat uint8 tensor (FlashInfer's workspace_buffer is often
    int8); other tensors are returned unchanged, for validation to describe."""
    fw = framework(x)
    if dtype_name(x) == "uint8" and len(shape(x)) == 1:
        return x
    if fw == "torch":
        import torch

        if x.is_contiguous():
            return x.reshape(-1).view(torch.uint8)
    elif fw in ("numpy", "cupy"):
        if x.flags.c_contiguous:
            return x.reshape(-1).view("uint8")
    return x
