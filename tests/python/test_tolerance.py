"""tolerance.py's error model accepts the out dtype's own rounding and rejects what it should: a
value moved by more than its allowance, a nonzero row where nothing is attended, NaN, an lse off
by a missing key's worth."""

from __future__ import annotations

import numpy as np
import pytest

from tolerance import assert_lse_close, assert_out_close


def rows(rng, n=6, width=64):
    ref = rng.standard_normal((n, width))
    ref[0] *= 1e-3  # a small row: its allowance scales with it
    ref[1] = 0.0  # nothing attended
    return ref


def test_float16_rounding_passes_and_a_larger_move_fails(rng):
    ref = rows(rng)
    got = ref.astype(np.float16)
    assert_out_close(got, ref)
    # One value moved by 4 half-ulps of float16 (2^-11 relative each): past rtol 2^-10 plus the
    # row term 1e-4 max|row| (the row's values are ~1).
    j = int(np.argmax(np.abs(ref[2])))
    bad = ref.copy()
    bad[2, j] *= 1 + 4 * 2.0**-11
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_out_close(bad.astype(np.float16), ref)


def test_small_rows_are_held_to_their_own_scale(rng):
    ref = rows(rng)
    bad = ref.copy()
    bad[0] += 1e-5  # far inside a fixed atol of 1e-3, ~1% of this row's values
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_out_close(bad.astype(np.float16), ref)


def test_a_row_without_keys_must_be_zero(rng):
    ref = rows(rng)
    bad = ref.astype(np.float16)
    bad[1, 5] = np.float16(1e-3)
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_out_close(bad, ref)


def test_bfloat16_rounding_passes_and_a_larger_move_fails(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ref = rows(rng)
    assert_out_close(ref.astype(ml_dtypes.bfloat16), ref)
    bad = ref.copy()
    j = int(np.argmax(np.abs(ref[3])))
    bad[3, j] *= 1 + 4 * 2.0**-8
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_out_close(bad.astype(ml_dtypes.bfloat16), ref)


def test_nan_never_passes(rng):
    ref = rows(rng)
    got = ref.astype(np.float16)
    got[4, 0] = np.nan
    with pytest.raises(AssertionError, match="NaN"):
        assert_out_close(got, ref)
    with pytest.raises(AssertionError, match="NaN"):
        assert_lse_close(np.array([1.0, np.nan], np.float32), np.array([1.0, 2.0]))


def test_out_dtype_without_a_model_is_refused():
    with pytest.raises(ValueError, match="no error model"):
        assert_out_close(np.zeros((1, 4), np.float32), np.zeros((1, 4)))


def test_lse_within_float32_passes_and_a_missing_key_fails():
    ref = np.array([0.5, 3.0, -np.inf, 40.0])
    assert_lse_close(ref.astype(np.float32), ref)
    # One key of weight exp(-9) of the sum dropped moves lse by ~1.2e-4: a fixed atol of 1e-4 plus
    # 1e-5 relative would have let it pass at lse 3.
    bad = ref.copy()
    bad[1] += np.log1p(np.exp(-9.0))
    with pytest.raises(AssertionError, match="lse values out of tolerance"):
        assert_lse_close(bad.astype(np.float32), ref)
    wrong_inf = ref.copy()
    wrong_inf[2] = 0.0
    with pytest.raises(AssertionError, match="infinite"):
        assert_lse_close(wrong_inf.astype(np.float32), ref)
