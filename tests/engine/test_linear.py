"""colibri.Linear (kernels/dense.c): y = x W^T on the expert kernels in every weight dtype,
against NumPy with the weights as the engine holds them; bad input refused with a message."""
import numpy as np
import pytest

import colibri
from colibri import quant

# float weights: float32 accumulation; int8/int4g32/int4: the activations are quantized too
RTOL = {"f32": 1e-5, "bf16": 1e-5, "int8": 2e-2, "int4g32": 3e-2, "int4": 3e-2}


@pytest.mark.parametrize("dtype", quant.DTYPES)
@pytest.mark.parametrize("rows,cols", [(37, 67), (300, 130), (5, 2048)])
def test_matches_numpy_on_ragged_shapes_and_every_path(dtype, rows, cols):
    rng = np.random.default_rng(rows + cols)
    W = rng.standard_normal((rows, cols), dtype=np.float32)
    ref_w = quant.roundtrip(W, dtype).astype(np.float64)
    with colibri.Linear(W, weight_dtype=dtype, threads=2) as lin:
        assert (lin.rows, lin.cols) == (rows, cols) and lin.weight_bytes > 0
        for T in (1, 2, 7, 40, 130):  # decode, prefill dot kernels, gemm path, two token chunks
            x = rng.standard_normal((T, cols), dtype=np.float32)
            y = lin(x)
            ref = x.astype(np.float64) @ ref_w.T
            assert y.shape == (T, rows)
            assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= RTOL[dtype], (dtype, T)
            out = np.full((T, rows), np.nan, np.float32)
            assert lin(x, out=out) is out and np.array_equal(out, y)


@pytest.mark.parametrize("dtype", quant.DTYPES)
def test_decode_is_the_same_at_every_thread_count(dtype):
    """Decode on several threads claims rows in chunks of about 2^20 weights
    (kernels/claim.c; here 3 chunks at one token, 5 at two, the last one short): the same
    bits as one thread, an odd thread count included."""
    rng = np.random.default_rng(3)
    W = rng.standard_normal((5000, 512), dtype=np.float32)
    lins = [colibri.Linear(W, weight_dtype=dtype, threads=n) for n in (1, 2, 3, 4)]
    ref_w = quant.roundtrip(W, dtype).astype(np.float64)
    for T in (1, 2):
        x = rng.standard_normal((T, 512), dtype=np.float32)
        outs = [lin(x) for lin in lins]
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])
        ref = x.astype(np.float64) @ ref_w.T
        assert np.linalg.norm(outs[0] - ref) / np.linalg.norm(ref) <= RTOL[dtype]
    for lin in lins:
        lin.close()


@pytest.mark.parametrize("dtype", ["int4g32", "int4"])
def test_from_encoded_is_the_same_as_from_floats(dtype):
    rng = np.random.default_rng(1)
    W = rng.standard_normal((20, 70), dtype=np.float32)
    x = rng.standard_normal((9, 70), dtype=np.float32)
    st, sc = quant.encode(W, dtype)
    with colibri.Linear(W, weight_dtype=dtype) as a, \
            colibri.Linear.from_encoded(st, sc, 70, weight_dtype=dtype) as b:
        assert np.array_equal(a(x), b(x))


def test_int4k_takes_no_scales():
    W = np.ones((4, 64), np.float32)
    st, _ = quant.encode(W, "int4")
    with pytest.raises(TypeError, match="no scales"):
        colibri.Linear.from_encoded(st, np.ones(4, np.float32), 64, weight_dtype="int4")


def test_bad_input_is_refused_with_a_message():
    rng = np.random.default_rng(2)
    W = rng.standard_normal((8, 16), dtype=np.float32)
    with pytest.raises(ValueError, match="weight_dtype"):
        colibri.Linear(W, weight_dtype="f64")
    with pytest.raises(ValueError):
        colibri.Linear(np.zeros((0, 16), np.float32))
    st, sc = quant.encode(W, "int8")
    with pytest.raises(TypeError, match="int8"):
        colibri.Linear.from_encoded(st.astype(np.uint8), sc, 16, weight_dtype="int8")
    with pytest.raises(ValueError, match="scales"):
        colibri.Linear.from_encoded(st, sc[:3], 16, weight_dtype="int8")
    with pytest.raises(ValueError, match="shape"):
        colibri.Linear.from_encoded(st[:, :8].copy(), sc, 16, weight_dtype="int8")
    lin = colibri.Linear(W)
    with pytest.raises(ValueError, match="x"):
        lin(np.zeros((3, 15), np.float32))
    x = np.zeros((3, 16), np.float32)
    with pytest.raises(ValueError, match="out"):
        lin(x, out=np.zeros((3, 7), np.float32))
    buf = np.zeros((3, 16), np.float32)
    with pytest.raises(ValueError, match="overlap"):
        colibri.Linear(np.eye(16, dtype=np.float32))(buf, out=buf)
    with pytest.raises(ValueError, match="threads"):
        colibri.Linear(W, threads=0)
    assert lin(np.zeros((0, 16), np.float32)).shape == (0, 8)
    lin.close()
    assert lin.closed
    with pytest.raises(ValueError, match="closed"):
        lin(x)
    lin.close()  # twice is fine
