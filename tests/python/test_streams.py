"""Which CUDA stream a call launches on: PyTorch's current stream (also while a CUDA graph is being
captured), CuPy's current stream, or an explicit ``stream=``. Checked through the module's
launch_stream, which reports the stream the GPU backend would use, so this runs on any CUDA machine,
with or without the sm90 backend."""

from __future__ import annotations

import numpy as np
import pytest

from mla_decode import _arrays
from mla_decode._lib import lib


def test_host_tensors_have_no_stream():
    assert lib().launch_stream(np.zeros(1, np.float32), None) == 0


def test_explicit_integer_stream_is_used_as_given():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    q = torch.zeros(1, device="cuda")
    assert lib().launch_stream(q, 1234) == 1234


def test_torch_current_stream_and_graph_capture_stream():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    q = torch.zeros(1, device="cuda")
    assert lib().launch_stream(q, None) == torch.cuda.current_stream().cuda_stream
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert lib().launch_stream(q, None) == s.cuda_stream != 0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        capturing = torch.cuda.current_stream().cuda_stream
        assert lib().launch_stream(q, None) == capturing
        q.add_(1)  # something to capture
    assert _arrays.stream_handle(s) == s.cuda_stream


def test_cupy_current_stream():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.zeros(4, cupy.float16)
        assert _arrays.current_stream(x) == stream.ptr
    assert _arrays.stream_handle(stream) == stream.ptr
