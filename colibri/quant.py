"""Weight formats: f32 -> bf16 and int8 (symmetric, one scale per row), and back.

One implementation, used by the layer binding and the model-file writer, so the
bytes the engine streams are the bytes the tests dequantize.
"""
from __future__ import annotations

import numpy as np

DTYPES = ("f32", "bf16", "int8")
DTYPE_CODES = {"f32": 0, "bf16": 1, "int8": 2}

# Worst-case element error of each format, as a bound the tests check:
# bf16 keeps 8 significant bits (7 stored), so round-to-nearest errs by at most 2^-8 relative;
# int8 errs by at most half a step, scale / 2, with scale = max|row| / 127.
BF16_REL_ERR = 2.0 ** -8


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest, ties to even; NaN stays NaN."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    bits = a.view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    out = ((bits + rounding) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def from_bf16(h: np.ndarray) -> np.ndarray:
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def quantize_int8(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., rows, cols] float32 -> (int8 same shape, float32 scales [..., rows])."""
    a = np.asarray(a, dtype=np.float32)
    amax = np.max(np.abs(a), axis=-1)
    scales = (amax / np.float32(127.0)).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1.0))
    q = np.clip(np.rint(a / safe[..., None]), -127, 127).astype(np.int8)
    return q, scales


def dequantize_int8(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) * scales[..., None]


def encode(a: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """float32 weights -> (stored array, int8 scales or None)."""
    if dtype == "f32":
        return np.ascontiguousarray(a, dtype=np.float32), None
    if dtype == "bf16":
        return to_bf16(a), None
    if dtype == "int8":
        q, s = quantize_int8(a)
        return np.ascontiguousarray(q), np.ascontiguousarray(s)
    raise ValueError(f"weight_dtype must be one of {DTYPES}, got {dtype!r}")


def decode(stored: np.ndarray, scales: np.ndarray | None, dtype: str) -> np.ndarray:
    """The float32 weights the engine computes with."""
    if dtype == "f32":
        return np.asarray(stored, dtype=np.float32)
    if dtype == "bf16":
        return from_bf16(stored)
    if dtype == "int8":
        return dequantize_int8(stored, scales)
    raise ValueError(f"weight_dtype must be one of {DTYPES}, got {dtype!r}")


def roundtrip(a: np.ndarray, dtype: str) -> np.ndarray:
    """a as the engine sees it after conversion to dtype."""
    return decode(*encode(a, dtype), dtype)


class PerExpert:
    """[E, ...] weights seen in `dtype`, converted per expert on access.

    The reference touches only the routed experts, so converting all of a large
    model up front would be wasted work."""

    def __init__(self, a: np.ndarray, dtype: str):
        self.a, self.dtype = a, dtype

    def __getitem__(self, e: int) -> np.ndarray:
        return roundtrip(self.a[e], self.dtype)
