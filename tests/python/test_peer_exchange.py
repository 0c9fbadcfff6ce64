"""The peer exchange (include/mla/exchange.h) through the Python module: its buffer size and its
validation, each refused call a ValueError naming the argument. The buffers are host arrays
presented as CUDA memory (fake_device.DeviceTensor) or plain host arrays: every rule is checked
before any memory is touched. The exchange itself runs in tests/sm90/exchange_test.cc (ranks
simulated on one GPU) and tests/python/test_distributed.py (two GPUs)."""

from __future__ import annotations

import numpy as np
import pytest

from fake_device import DeviceTensor
from mla_decode._lib import lib


def test_buffer_bytes():
    assert lib().peer_exchange_buffer_bytes(2, 1024) == 5 * 2 * 1024 + 256
    assert lib().peer_exchange_buffer_bytes(8, 16) == 5 * 8 * 16 + 256
    with pytest.raises(ValueError, match="num_ranks: expected 1 to 8, got 9"):
        lib().peer_exchange_buffer_bytes(9, 1024)
    with pytest.raises(ValueError, match="slot_bytes: expected a positive multiple of 16"):
        lib().peer_exchange_buffer_bytes(2, 24)


def call(buffer, peers, rank=0, slot_bytes=1024):
    lib().peer_exchange(buffer, peers, rank, slot_bytes, "auto", False, None)


def fake_buffers(n=2, slot_bytes=1024):
    size = lib().peer_exchange_buffer_bytes(n, slot_bytes)
    arrays = [np.zeros(size + 16, dtype=np.uint8) for _ in range(n)]
    # 16-byte aligned views of each array
    views = [a[(-a.ctypes.data) % 16:][:size] for a in arrays]
    addresses = np.array([v.ctypes.data for v in views], dtype=np.int64)
    return arrays, views, addresses


def test_host_buffer_refused():
    _, views, addresses = fake_buffers()
    with pytest.raises(ValueError, match="buffer: the peer exchange moves bytes between GPUs"):
        call(views[0], addresses)


def test_rank_and_sizes_refused():
    _, views, addresses = fake_buffers()
    with pytest.raises(ValueError, match="rank: expected 0 <= rank < num_ranks"):
        call(DeviceTensor(views[0]), addresses, rank=2)
    with pytest.raises(ValueError, match="slot_bytes: expected a positive multiple of 16"):
        call(DeviceTensor(views[0]), addresses, slot_bytes=1000)
    with pytest.raises(ValueError, match="buffer: expected at least"):
        call(DeviceTensor(views[0][:-16]), addresses)


def test_peer_buffers_refused():
    _, views, addresses = fake_buffers()
    with pytest.raises(ValueError, match="peer_buffers: expected a 1-D int64 host tensor"):
        call(DeviceTensor(views[0]), addresses.astype(np.int32))
    with pytest.raises(ValueError, match="num_ranks: expected 1 to 8 peer_buffers, got 9"):
        call(DeviceTensor(views[0]), np.repeat(addresses, 5)[:9])
    same = r"peer_buffers\[1\]: the same address as peer_buffers\[0\]"
    with pytest.raises(ValueError, match=same):
        call(DeviceTensor(views[0]), np.array([addresses[0], addresses[0]], dtype=np.int64))
    with pytest.raises(ValueError, match=r"peer_buffers\[0\]: expected this rank's own buffer"):
        call(DeviceTensor(views[0]), addresses[::-1].copy())
