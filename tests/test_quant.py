"""Weight formats: the rounding each one implies, stated and checked.

bf16: round to nearest even keeps 8 significant bits, so |w - bf16(w)| <= 2^-8 |w|.
int8: per row, scale = max|row| / 127 and |w - q * scale| <= scale / 2.
End to end (a whole layer, random weights), the output's relative L2 error against
the f32-weight reference stays below 4 * 2^-8 (bf16) and 4 / 127 (int8): each of the
three matrices contributes at most its element bound, which random signs mostly
cancel.
"""
import numpy as np
import pytest

import colibri
from colibri import quant
from moe_data import make_case


def test_bf16_rounding_bound_and_ties_to_even():
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(100000) * 10.0 ** rng.uniform(-20, 20, 100000)).astype(np.float32)
    back = quant.roundtrip(a, "bf16")
    assert np.all(np.abs(back - a) <= quant.BF16_REL_ERR * np.abs(a))
    # 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0)
    half = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8], np.float32)
    assert quant.roundtrip(half, "bf16").tolist() == [1.0, 1 + 2 ** -6]
    special = np.array([np.inf, -np.inf, 0.0, -0.0, np.nan], np.float32)
    r = quant.roundtrip(special, "bf16")
    assert r[0] == np.inf and r[1] == -np.inf and r[2] == 0 and np.isnan(r[4])


def test_int8_rounding_bound():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 333)).astype(np.float32) * rng.uniform(0.01, 100, (64, 1)).astype(np.float32)
    a[3] = 0.0  # an all-zero row must not divide by zero
    q, s = quant.quantize_int8(a)
    assert q.dtype == np.int8 and s.shape == (64,)
    assert np.all(np.abs(q) <= 127)
    err = np.abs(quant.dequantize_int8(q, s) - a)
    assert np.all(err <= s[:, None] / 2 * (1 + 1e-6))
    assert np.all(quant.dequantize_int8(q, s)[3] == 0)


@pytest.mark.parametrize("dtype, bound", [("bf16", 4 * 2.0 ** -8), ("int8", 4 / 127)])
def test_layer_error_against_f32_weights(lib, dtype, bound):
    case = make_case(H=512, I=256, E=8, k=2)
    x = case.inputs(16)
    ref = case.reference(x, "f32")
    out = colibri.MoELayer(case.router, case.gate, case.up, case.down, weight_dtype=dtype,
                           **case.layer_kwargs())(x)
    rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert rel < bound, f"{dtype}: relative L2 error {rel:.3g} >= {bound:.3g}"
