"""kernels/bf16io.c: the layer and dense entry points for bf16 activations. Their output must
be the f32 entry point's on the same (bf16-exact) input, rounded to nearest even: bit for
bit, in every weight dtype, for decode and for a prefill large enough to convert in threads."""
import numpy as np
import pytest

import colibri
from colibri import quant
from colibri._lib import ffi
from moe_data import make_case

DTYPES = ["f32", "bf16", "int8", "int4g32", "int4"]


def bf16_rows(rng, T, width):
    """bf16 bits of random rows, and their exact float32 values."""
    bits = quant.to_bf16(rng.standard_normal((T, width), dtype=np.float32))
    return bits, quant.from_bf16(bits)


def ptr(a):
    return ffi.cast("uintptr_t", ffi.from_buffer(a))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 3, 200])  # 200 x 130 values: the conversion runs in threads
def test_layer_bf16_is_the_f32_output_rounded(lib, dtype, T):
    case = make_case(H=130, I=70, E=6, k=2, S=24, gated=True, seed=4)
    with colibri.MoELayer(case.router, case.gate, case.up, case.down, weight_dtype=dtype, threads=2,
                          **case.layer_kwargs()) as L:
        bits, xf = bf16_rows(np.random.default_rng(T), T, 130)
        want = quant.to_bf16(L(xf))
        out = np.full_like(bits, 0xFFFF)
        L._forward_ptrs(int(ptr(bits)), int(ptr(out)), T, bf16=True)
        assert np.array_equal(out, want)
        # in place: all of x is read before y is written
        L._forward_ptrs(int(ptr(bits)), int(ptr(bits)), T, bf16=True)
        assert np.array_equal(bits, want)


def test_layer_bf16_keeps_a_bad_token_to_itself(lib):
    case = make_case(H=64, I=32, E=4, k=2)
    with colibri.MoELayer(case.router, case.gate, case.up, case.down, **case.layer_kwargs()) as L:
        bits, xf = bf16_rows(np.random.default_rng(0), 3, 64)
        bits[1, 5] = 0x7FC0  # NaN
        out = np.zeros_like(bits)
        L._forward_ptrs(int(ptr(bits)), int(ptr(out)), 3, bf16=True)
        y = quant.from_bf16(out)
        assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2]]).all()
        assert np.array_equal(out[[0, 2]], quant.to_bf16(L(xf[[0, 2]])))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 150])
def test_dense_bf16_is_the_f32_output_rounded(lib, dtype, T):
    rng = np.random.default_rng(7)
    W = rng.standard_normal((96, 200), dtype=np.float32)
    with colibri.Linear(W, weight_dtype=dtype, threads=2) as lin:
        bits, xf = bf16_rows(rng, T, 200)
        out = np.zeros((T, 96), np.uint16)
        lin._forward_ptrs(int(ptr(bits)), int(ptr(out)), T, bf16=True)
        assert np.array_equal(out, quant.to_bf16(lin(xf)))


def test_bad_calls_are_clear_errors():
    x = np.zeros((2, 16), np.uint16)
    p = ffi.cast("uint16_t *", ffi.from_buffer(x))
    case = make_case(H=16, I=8, E=4, k=2)
    with colibri.MoELayer(case.router, case.gate, case.up, case.down, **case.layer_kwargs()) as L:
        lib, lp = L._lib, L._live()
        assert lib.colibri_layer_forward_bf16(ffi.NULL, p, p, 2, 1) != 0
        assert "layer is NULL" in ffi.string(lib.colibri_last_error()).decode()
        assert lib.colibri_dense_forward_bf16(ffi.NULL, p, p, 2, 1) != 0
        assert "dense matrix is NULL" in ffi.string(lib.colibri_last_error()).decode()
        assert lib.colibri_layer_forward_bf16(lp, p, p, -1, 1) != 0
        assert "n_tokens -1" in ffi.string(lib.colibri_last_error()).decode()
        assert lib.colibri_layer_forward_bf16(lp, ffi.NULL, p, 2, 1) != 0
        assert "must not be NULL" in ffi.string(lib.colibri_last_error()).decode()
        assert lib.colibri_layer_forward_bf16(lp, p, p, 2, 100000) != 0
        assert lib.colibri_layer_forward_bf16(lp, p, p, 0, 1) == 0
