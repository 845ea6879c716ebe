"""Weight formats the quantisation-error harness (colibri_bench/quanterr.py) sets beside
Colibri's own, as NumPy round-trips: float32 weights [rows, cols] in, the float32 weights
a kernel of that format would multiply out, and the format's bits per weight (scales
included).

- ggml's q4_0, q4_1 and q8_0, written here from their published block layouts (blocks
  of 32 weights along a row):
  - q4_0: an f16 scale d = (the weight of largest magnitude) / -8 and 4-bit q with
    w = (q - 8) d (18 bytes per 32: 4.5 bits per weight);
  - q4_1: f16 d = (max - min) / 15 and f16 m = min, w = q d + m (20 bytes: 5.0);
  - q8_0: f16 d = max|w| / 127, w = q d with q in -127..127 (34 bytes: 8.5).
- k4: the NumPy statement of Colibri's int4 fit (issue 29; the engine's is C,
  kernels/int4k.c, and tests/bench/test_quanterr.py holds the two to the same bits),
  K-quant style: super-blocks of 256 weights hold 8 sub-blocks of 32; a sub-block's weights
  are w = d sc q - dmin mn with q in 0..15 and 6-bit sc and mn, d and dmin f16 per
  super-block: (1024 + 8 x 12 + 32) bits per 256 weights = 4.5 bits per weight. Each
  sub-block's scale and offset are fitted by least squares over a few starting ranges
  before the 6-bit rounding. The harness lists int4 among Colibri's dtypes.

Rows are padded with zeros to whole blocks; the padding is not counted in the error.
"""
from __future__ import annotations

import numpy as np


def _blocks(a: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """a [rows, cols] float32 as [rows, nblocks, size], zero-padded; returns it and cols."""
    a = np.asarray(a, dtype=np.float32)
    rows, cols = a.shape
    nb = -(-cols // size)
    pad = nb * size - cols
    if pad:
        a = np.concatenate([a, np.zeros((rows, pad), np.float32)], axis=1)
    return a.reshape(rows, nb, size), cols


def _unblock(b: np.ndarray, cols: int) -> np.ndarray:
    return np.ascontiguousarray(b.reshape(b.shape[0], -1)[:, :cols], dtype=np.float32)


def _f16(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)


def q4_0(a: np.ndarray) -> np.ndarray:
    b, cols = _blocks(a, 32)
    idx = np.argmax(np.abs(b), axis=-1)[..., None]
    amax = np.take_along_axis(b, idx, axis=-1)        # signed: the largest magnitude
    d = _f16(amax / -8.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d != 0, 1.0 / d, 0.0)
    q = np.clip(np.floor(b * inv + 8.5), 0, 15)
    return _unblock((q - 8) * d, cols)


def q4_1(a: np.ndarray) -> np.ndarray:
    b, cols = _blocks(a, 32)
    lo, hi = b.min(axis=-1, keepdims=True), b.max(axis=-1, keepdims=True)
    d, m = _f16((hi - lo) / 15.0), _f16(lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d != 0, 1.0 / d, 0.0)
    q = np.clip(np.floor((b - m) * inv + 0.5), 0, 15)
    return _unblock(q * d + m, cols)


def q8_0(a: np.ndarray) -> np.ndarray:
    b, cols = _blocks(a, 32)
    d = _f16(np.abs(b).max(axis=-1, keepdims=True) / 127.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d != 0, 1.0 / d, 0.0)
    return _unblock(np.clip(np.rint(b * inv), -127, 127) * d, cols)


K4_SUPER, K4_SUB = 256, 32
K4_SHRINK = (1.0, 0.95, 0.9, 0.85, 0.8)  # starting ranges, as fractions of max - min


def _assign(x, s, m):
    """q of x against w = s q - m (0 where s is 0), as kernels/int4k.c: times 1 / s"""
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(s > 0, 1.0 / s, 0.0)
    return np.clip(np.rint((x + m) * inv), 0, 15)


def _fit_sub(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sub-block (last axis of x) the scale s >= 0 and offset m >= 0 of w = s q - m,
    q in 0..15, with the least squared error found from a few starting ranges."""
    lo = np.minimum(x.min(axis=-1, keepdims=True), 0.0)
    hi = x.max(axis=-1, keepdims=True)
    best_s, best_m = (hi - lo) / 15.0, -lo
    best_e = np.full(lo.shape, np.inf, np.float32)
    for shrink in K4_SHRINK:
        s, m = (hi - lo) * shrink / 15.0, -lo * shrink
        for _ in range(2):
            q = _assign(x, s, m)
            # least squares of x on [q, -1], with m kept >= 0
            n = x.shape[-1]
            sq, sx = q.sum(-1, keepdims=True), x.sum(-1, keepdims=True)
            sqq, sqx = (q * q).sum(-1, keepdims=True), (q * x).sum(-1, keepdims=True)
            det = n * sqq - sq * sq
            with np.errstate(divide="ignore", invalid="ignore"):
                s_ls = np.where(det > 0, (n * sqx - sq * sx) / det, s)
                m_ls = np.where(det > 0, (sq * s_ls - sx) / n, m)
                s_0 = np.where(sqq > 0, sqx / sqq, s)  # the fit with m = 0
            s = np.where(m_ls >= 0, s_ls, s_0)
            m = np.where(m_ls >= 0, m_ls, 0.0)
            s = np.maximum(s, 0.0)
        q = _assign(x, s, m)
        e = ((s * q - m - x) ** 2).sum(-1, keepdims=True)
        better = e < best_e
        best_s, best_m, best_e = (np.where(better, s, best_s), np.where(better, m, best_m),
                                  np.where(better, e, best_e))
    return best_s, best_m


def k4(a: np.ndarray) -> np.ndarray:
    b, cols = _blocks(a, K4_SUPER)
    x = b.reshape(b.shape[0], b.shape[1], K4_SUPER // K4_SUB, K4_SUB).astype(np.float64)
    s, m = _fit_sub(x)                                  # [rows, nb, 8, 1]
    d = _f16(s.max(axis=2, keepdims=True) / 63.0)
    dmin = _f16(m.max(axis=2, keepdims=True) / 63.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.rint(np.where(d > 0, s / d, 0.0)), 0, 63)
        mn = np.clip(np.rint(np.where(dmin > 0, m / dmin, 0.0)), 0, 63)
    s, m = d * sc, dmin * mn
    q = _assign(x, s, m)
    return _unblock((s * q - m).reshape(b.shape), cols)


# name -> (round-trip, bits per weight, what it is)
FORMATS = {
    "ggml-q8_0": (q8_0, 8.5, "ggml q8_0: blocks of 32, f16 scale (reference)"),
    "ggml-q4_0": (q4_0, 4.5, "ggml q4_0: blocks of 32, f16 scale, levels -8..7 (reference)"),
    "ggml-q4_1": (q4_1, 5.0, "ggml q4_1: blocks of 32, f16 scale and min (reference)"),
}
