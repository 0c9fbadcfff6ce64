"""A DLPack tensor that claims to live on another device (e.g. CUDA) while its memory is a host
array. Only for validation tests: every device rule is checked before any memory is touched, so
the call is refused without a GPU and without reading the pointer."""

from __future__ import annotations

import ctypes
from typing import Any, Tuple

import numpy as np


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


_CODES = {"i": 0, "u": 1, "f": 2}

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DeviceTensor:
    """`array`'s shape, strides and dtype, presented as living on (device_type, device_id)."""

    def __init__(self, array: np.ndarray, device_type: int = 2, device_id: int = 0) -> None:
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self._device = (device_type, device_id)
        self._keep: list = []

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self._device

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        a = self.array
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        strides = (ctypes.c_int64 * a.ndim)(*(s // a.itemsize for s in a.strides))
        managed = _DLManagedTensor()
        managed.dl_tensor.data = a.ctypes.data
        managed.dl_tensor.device = _DLDevice(*self._device)
        managed.dl_tensor.ndim = a.ndim
        managed.dl_tensor.dtype = _DLDataType(_CODES[a.dtype.kind], a.dtype.itemsize * 8, 1)
        managed.dl_tensor.shape = shape
        managed.dl_tensor.strides = strides
        self._keep.append((shape, strides, managed))  # alive as long as this object
        return _capsule_new(ctypes.addressof(managed), b"dltensor", None)
