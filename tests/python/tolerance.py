"""The error model of the C++ tests (tests/common/test_util.h: OutTolerance, kLseAtol, kLseRtol)
for the Python tests, against the float64 reference.

out, per row (the kv_lora_rank values of one (token, head)):
    |got - ref| <= atol_row * max|ref over the row| + rtol * |ref| + atol_abs
- rtol: the final rounding to the out dtype, twice its half ulp (half an ulp is 2^-8 relative
  for bfloat16, 2^-11 for float16: rtol 2^-7 and 2^-10);
- atol_abs: float16's subnormal range, where the spacing is a fixed 2^-24 (bfloat16 has float32's
  range: no floor);
- atol_row (1e-4): float32 accumulation in the softmax and the weighted sum, which scales with the
  row's magnitude rather than the element's.
A row whose reference is exactly 0 (nothing attended) must come out exactly 0 (float16: within
its subnormal spacing). These hold for a backend that keeps P in float32 (the cpu backend); a
route that rounds P to a narrower type adds p_rel * ref_abs, as the C++ tests do.

lse (float32, from float32 scores): within 2e-5 + 2e-5 |lse| of the reference, which catches a
missing or extra key, a dropped block, a wrong max or a sink wrongly included.

The Python tests of the cpu backend use it (test_decode.py, test_validation.py and the cpu cases of
test_flashinfer_conformance.py); test_tolerance.py shows it failing where it should. The cases
that run on a GPU from Python (test_gpu*.py, the PyTorch, JAX and CuPy cases) keep fixed bounds
wide enough for the sm90 routes' rounding of P and of split partials; the per-route error models
of those kernels are the C++ GPU tests' (tests/common/).
"""

from __future__ import annotations

import numpy as np

# (rtol, atol_row, atol_abs) per out dtype name.
OUT_MODEL = {
    "bfloat16": (1.0 / 128, 1e-4, 0.0),
    "float16": (1.0 / 1024, 1e-4, 2.0**-24),
}
LSE_ATOL = 2e-5
LSE_RTOL = 2e-5


def _dtype_name(x) -> str:
    dtype = getattr(x, "dtype", None)
    name = getattr(dtype, "name", None) or str(dtype)
    return name.replace("torch.", "")


def assert_out_close(got, ref, dtype: str | None = None) -> None:
    """got: the library's out (any array NumPy can read; its dtype names the model unless `dtype`
    does); ref: the float64 reference of the same shape. Rows are the last axis."""
    name = dtype or _dtype_name(got)
    if name not in OUT_MODEL:
        raise ValueError(f"assert_out_close: no error model for out dtype {name}")
    rtol, atol_row, atol_abs = OUT_MODEL[name]
    got = np.asarray(got).astype(np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert not np.isnan(got).any(), "out holds NaN (unwritten or poisoned read)"
    row_max = np.abs(ref).max(axis=-1, keepdims=True) if ref.size else ref
    allowed = atol_row * row_max + rtol * np.abs(ref) + atol_abs
    err = np.abs(got - ref)
    bad = ~(err <= allowed)
    if bad.any():
        idx = np.argwhere(bad)
        first = tuple(idx[0])
        raise AssertionError(
            f"{len(idx)} of {got.size} out values ({name}) out of tolerance; first at {first}: "
            f"got {got[first]!r}, reference {ref[first]!r}, allowed {allowed[first]:.3g}; "
            f"worst err/allowed {np.max(err[bad] / np.maximum(allowed[bad], 1e-300)):.3g}")


def assert_lse_close(got, ref) -> None:
    """got: the library's lse (float32); ref: the float64 reference. -inf (nothing attended) must
    match exactly; NaN never passes."""
    got = np.asarray(got).astype(np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert not np.isnan(got).any(), "lse holds NaN"
    inf = np.isinf(ref)
    assert (got[inf] == ref[inf]).all(), "lse differs where the reference is infinite"
    fin = ~inf
    err = np.abs(got[fin] - ref[fin])
    allowed = LSE_ATOL + LSE_RTOL * np.abs(ref[fin])
    bad = ~(err <= allowed)
    if bad.any():
        i = int(np.argmax(bad))
        raise AssertionError(
            f"{int(bad.sum())} of {fin.sum()} lse values out of tolerance (atol {LSE_ATOL}, rtol "
            f"{LSE_RTOL}); e.g. got {got[fin][i]!r}, reference {ref[fin][i]!r}")
