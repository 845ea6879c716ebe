"""Argument checks shared by the binding: a wrong array is a clear exception, never a crash."""
from __future__ import annotations

import numpy as np


# COLIBRI_MAX_THREADS in kernels/colibri.h (tests/engine/test_api_errors.py checks they agree).
MAX_THREADS = 1024


def f32_array(name: str, a, shape: tuple[int | None, ...], *, writeable: bool = False) -> np.ndarray:
    """a must be a C-contiguous float32 ndarray of `shape` (None = any size); writeable when
    the engine writes into it (cffi would hand C a read-only buffer without complaint)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of float32, got {type(a).__name__}")
    if a.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32, got {a.dtype}")
    if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, a.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use numpy.ascontiguousarray)")
    if writeable and not a.flags.writeable:
        raise ValueError(f"{name} is read-only; the engine writes into it")
    return a


def positive_int(name: str, v, *, allow_zero: bool = False, maximum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {v}")
    return int(v)


def unit_float(name: str, v) -> float:
    """A real number in [0, 1] (NaN is refused: it would silently pick a mode)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(v).__name__}")
    f = float(v)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {v}")
    return f
