"""Weight formats: the rounding each one implies, stated and checked.

bf16: round to nearest even keeps 8 significant bits, so |w - bf16(w)| <= 2^-8 |w|.
int8: per row, scale = max|row| / 127 and |w - q * scale| <= scale / 2.
int4g32: per group of 32 along a row, scale = max|group| / 7 and |w - q * scale| <= scale / 2;
the int8 and int4g32 kernels also quantize activations per group of 32 to int8:
|x - x'| <= max|group| / 254.
End to end (a whole layer, random weights), the output's relative L2 error against
the f32-weight reference stays below 4 * 2^-8 (bf16), 4 / 127 (int8) and 4 / 14 (int4g32:
measured 0.13-0.18 on random Gaussian weights, whose groups use the 15 levels
worst; the activation rounding adds about 0.01): each of the three matrices
contributes at most its element bound, which random signs mostly cancel.
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


def test_int4_rounding_bound_and_layout():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((40, 77)).astype(np.float32) * rng.uniform(0.01, 100, (40, 1)).astype(np.float32)
    a[5] = 0.0
    q, s = quant.quantize_int4(a)
    assert q.dtype == np.uint8 and q.shape == (40, 3 * 16) and s.shape == (40, 3)
    back = quant.dequantize_int4(q, s, 77)
    group_scale = np.repeat(s, 32, axis=1)[:, :77]
    assert np.all(np.abs(back - a) <= group_scale / 2 * (1 + 1e-6))
    assert np.all(back[5] == 0)
    # layout: byte j of group g = (q[32g+j] + 8) | (q[32g+16+j] + 8) << 4; padding q = 0
    nib = np.concatenate([q.reshape(40, 3, 16) & 15, q.reshape(40, 3, 16) >> 4], axis=2)
    qq = np.rint(a / np.where(s > 0, s, 1).repeat(32, axis=1)[:, :77])
    assert np.array_equal(nib.reshape(40, 96)[:, :77].astype(int) - 8, qq.astype(int))
    assert np.all(nib.reshape(40, 96)[:, 77:] == 8)
    assert quant.stored_bytes("int4g32", 40, 77) == q.nbytes + s.nbytes


@pytest.mark.parametrize("fn", [quant.quantize_int8, quant.quantize_int4])
def test_quantizers_work_row_by_row(fn):
    """A matrix in slices of rows (the quantizers' cache blocking) quantizes as each of its
    rows does alone: leading dimensions, a row count off the slice size, zero rows, a
    ragged last group and a transposed (non-contiguous) input."""
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((3, 600, 70)) * rng.uniform(0, 4, (3, 600, 1))).astype(np.float32)
    a[1, 7] = 0.0
    for m in (a, np.ascontiguousarray(a[0].T).T):
        q, s = fn(m)
        for idx in np.ndindex(m.shape[:-1]):
            qr, sr = fn(np.ascontiguousarray(m[idx])[None])
            np.testing.assert_array_equal(q[idx], qr[0])
            np.testing.assert_array_equal(s[idx], sr[0])


def test_activation_quantization_bound():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 100)).astype(np.float32) * 5
    xq = quant.quantize_activations(x)
    g = np.pad(np.abs(x), ((0, 0), (0, 28))).reshape(7, 4, 32).max(axis=2)
    bound = np.repeat(g, 32, axis=1)[:, :100] / 254
    assert np.all(np.abs(xq - x) <= bound * (1 + 1e-5))


@pytest.mark.parametrize("dtype, bound", [("bf16", 4 * 2.0 ** -8), ("int8", 4 / 127),
                                          ("int4g32", 4 / 14)])
def test_layer_error_against_f32_weights(lib, dtype, bound):
    case = make_case(H=512, I=256, E=8, k=2)
    x = case.inputs(16)
    ref = case.reference(x, "f32")
    out = colibri.MoELayer(case.router, case.gate, case.up, case.down, weight_dtype=dtype,
                           **case.layer_kwargs())(x)
    rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert rel < bound, f"{dtype}: relative L2 error {rel:.3g} >= {bound:.3g}"
