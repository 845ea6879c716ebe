"""colibri_bench quant: each weight format's bits and error, bounded; the ggml reference
formats checked by hand; int4 against issue 29's target (<= 4.5 bits per weight, error
<= q4_1's on Gaussian and Student-t(4) weights), and its C fit against the NumPy one."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from colibri_bench import qformats, quanterr

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rows():
    return {r["format"]: r for r in quanterr.measure(rows=128, cols=1024, tokens=8, seed=3)}


# upper bounds of the relative error (weights, layer), Gaussian / Student-t(4); measured
# at this size: bf16 0.0017, int8 0.008 / 0.02, int4g32 0.097 / 0.13
BOUNDS = {"bf16": (0.003, 0.003), "int8": (0.012, 0.03), "int4g32": (0.105, 0.145),
          "int4": (0.08, 0.1)}  # int4: 0.073 / 0.089


def test_colibri_dtypes_errors_and_bits(rows):
    assert rows["f32"]["weight_err_gaussian"] == 0 and rows["f32"]["layer_err_student_t4"] == 0
    for dt, (g, t) in BOUNDS.items():
        r = rows[dt]
        assert 0 < r["weight_err_gaussian"] < g and 0 < r["layer_err_gaussian"] < g, r
        assert 0 < r["weight_err_student_t4"] < t and 0 < r["layer_err_student_t4"] < t, r
    assert [rows[d]["bits_per_weight"] for d in ("f32", "bf16", "int4g32")] == [32, 16, 5.0]
    assert rows["int8"]["bits_per_weight"] == 8 + 32 / 1024  # a float32 scale per row


def test_references_and_int4k(rows):
    assert [rows[f]["bits_per_weight"] for f in ("ggml-q4_0", "ggml-q4_1", "ggml-q8_0", "int4")] == \
        [4.5, 5.0, 8.5, 4.5]
    for d in quanterr.DISTRIBUTIONS:
        for kind in ("weight", "layer"):
            err = {f: rows[f][f"{kind}_err_{d}"] for f in rows}
            # q4_1's min buys accuracy over q4_0; Colibri's int4g32 today is worse than both
            assert err["ggml-q8_0"] < err["ggml-q4_1"] < err["ggml-q4_0"] < err["int4g32"], (d, kind, err)
            assert err["int4"] <= err["ggml-q4_1"], (d, kind, err)


def test_q4_0_and_q4_1_by_hand():
    x = (np.arange(32, dtype=np.float32) - 16) / 2  # -8 .. 7.5
    # q4_0: the largest magnitude is -8, so d = -8 / -8 = 1 and q = floor(x + 8.5) in 0..15
    got = qformats.q4_0(x[None])[0]
    want = np.clip(np.floor(x + 8.5), 0, 15) - 8
    assert np.array_equal(got, want) and got[0] == -8 and got[-1] == 7  # 7.5 clips to 7
    # q4_1: d = 15.5 / 15, m = -8; a block whose values are on its grid comes back exactly
    grid = np.float32(-8) + np.arange(16, dtype=np.float32).repeat(2) * np.float32(0.5)
    assert np.array_equal(qformats.q4_1(grid[None])[0], grid)


def test_k4_is_16_levels_per_sub_block_and_pads():
    rng = np.random.default_rng(1)
    w = rng.standard_t(4, (4, 300)).astype(np.float32)  # not a whole super-block
    got = qformats.k4(w)
    assert got.shape == w.shape and got.dtype == np.float32
    for r in range(4):
        for j in range(0, 288, 32):
            assert len(np.unique(got[r, j:j + 32])) <= 16
    assert np.array_equal(qformats.k4(np.zeros((2, 256), np.float32)), np.zeros((2, 256), np.float32))


@pytest.mark.parametrize("cols", [256, 300, 1408, 33])
def test_int4k_c_fit_is_the_numpy_fit(lib, cols):
    """kernels/int4k.c and qformats.k4 agree bit for bit (both in double, one order of
    operations); rows of every kind: Gaussian, heavy tails, one sign, constant, zero, tiny."""
    from colibri import quant
    rng = np.random.default_rng(cols)
    w = np.concatenate([rng.standard_normal((6, cols)), rng.standard_t(4, (6, cols)) * 0.02,
                        np.abs(rng.standard_normal((2, cols))), -np.abs(rng.standard_normal((2, cols))),
                        np.full((1, cols), 0.37), np.zeros((1, cols)), rng.standard_normal((1, cols)) * 1e-30]
                       ).astype(np.float32)
    st = quant.quantize_int4k(w)
    assert st.shape == (len(w), quant.int4k_row_bytes(cols))
    np.testing.assert_array_equal(quant.dequantize_int4k(st, cols), qformats.k4(w))


def test_int4k_nan_rows_and_overflow(lib):
    from colibri import _lib, quant
    w = np.ones((3, 300), np.float32)
    w[1, 290] = np.nan                      # in the second super-block only
    got = quant.roundtrip(w, "int4")
    assert np.isnan(got[1, 256:]).all() and np.isfinite(got[1, :256]).all()
    assert np.isfinite(got[[0, 2]]).all()
    with pytest.raises(_lib.ColibriError, match="too large for f16"):
        quant.quantize_int4k(np.full((2, 64), 3e9, np.float32))


def test_cli_writes_json_and_refuses_an_unknown_format(tmp_path):
    out = tmp_path / "quant.json"
    res = subprocess.run([sys.executable, "-m", "colibri_bench", "quant", "--rows", "32", "--cols", "256",
                          "--format", "int4g32", "--format", "ggml-q4_0", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert [r["format"] for r in json.loads(out.read_text())["rows"]] == ["int4g32", "ggml-q4_0"]
    assert "student_t4 layer" in res.stdout and "written:" in res.stdout
    bad = subprocess.run([sys.executable, "-m", "colibri_bench", "quant", "--format", "q9"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
