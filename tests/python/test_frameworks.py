"""Other DLPack frameworks: JAX arrays on the host (immutable: outputs are allocated and returned as
new JAX arrays) and CuPy arrays on a Hopper GPU (launched on CuPy's current stream). Each part is
skipped when its framework (or, for CuPy, the sm90 backend) is missing."""

from __future__ import annotations

import numpy as np
import pytest

import mla_decode
from cases import make_case

TOL = dict(rtol=1e-2, atol=1e-2)


def test_jax_host_arrays(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    case = make_case(rng, batch=2, q_len=2, seq_lens=[3, 11])
    ref_out, ref_lse = case.reference()
    cpu = jax.devices("cpu")[0]
    args = [jax.device_put(jnp.asarray(a), cpu) for a in case.args()]
    out, lse = mla_decode.batch_decode(*args, return_lse=True, **case.kwargs())
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    assert out.dtype == jnp.bfloat16  # JAX has bfloat16: the contract's default for float32 queries
    np.testing.assert_allclose(np.asarray(out, np.float64), ref_out, **TOL)
    np.testing.assert_allclose(np.asarray(lse, np.float64), ref_lse, rtol=1e-5, atol=1e-4)


def test_jax_flashinfer_call(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    case = make_case(rng, batch=2, q_len=2, seq_lens=[3, 11])
    ref_out, ref_lse = case.reference()
    cpu = jax.devices("cpu")[0]
    query, kv, tables, lens = [jax.device_put(jnp.asarray(a), cpu) for a in case.args()]
    query, kv = query.astype(jnp.float16), kv.astype(jnp.float16)
    out, lse = mla_decode.trtllm_batch_decode_with_kv_cache_mla(
        query, kv, np.zeros(1 << 20, np.int8), 128, case.kv_lora_rank, case.qk_rope_head_dim,
        tables, lens, int(case.block_tables.shape[1] * 4), bmm1_scale=case.extra["bmm1_scale"],
        return_lse=True,
    )
    assert isinstance(out, jax.Array) and out.dtype == jnp.bfloat16  # FlashInfer's default
    assert lse.shape == (4, case.num_heads)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref_out, **TOL)
    np.testing.assert_allclose(np.asarray(lse, np.float64), ref_lse.reshape(4, -1), **TOL)


def test_cupy_arrays_on_the_current_stream(rng):
    cupy = pytest.importorskip("cupy")
    if "sm90" not in mla_decode.available_backends():
        pytest.skip("this build has no sm90 backend")
    case = make_case(rng, batch=2, q_len=1, heads=16, kv_lora_rank=512, rope_dim=64,
                     page_size=64, seq_lens=[100, 700])
    ref_out, _ = case.reference()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        args = [cupy.asarray(a.astype(np.float16) if a.dtype == np.float32 else a)
                for a in case.args()]
        out = mla_decode.batch_decode(*args, **case.kwargs())
    stream.synchronize()
    assert out.dtype == np.float16
    np.testing.assert_allclose(cupy.asnumpy(out).astype(np.float64), ref_out, **TOL)
