"""Linear: one dense weight matrix on the engine (y = x W^T), the single-expert case of the
expert kernels, in any weight dtype (colibri.hf's `linear=True` runs a model's projections
on it)."""
from __future__ import annotations

import threading

import numpy as np

from . import quant
from ._checks import MAX_THREADS, f32_array, positive_int
from ._lib import check, ffi, open_library

_INT_MAX = 2**31 - 1


class Linear:
    """weight [rows, cols] float32, converted to `weight_dtype` and copied into the engine.
    Calling it on float32 x [T, cols] returns x W^T [T, rows]. close() (or leaving a `with`
    block) frees the engine's copy; calls from several Python threads run one at a time."""

    def __init__(self, weight, *, weight_dtype="f32", threads=None, lib=None):
        if weight_dtype not in quant.DTYPES:
            raise ValueError(f"weight_dtype must be one of {quant.DTYPES}, got {weight_dtype!r}")
        weight = f32_array("weight", weight, (None, None))
        if min(weight.shape) < 1:
            raise ValueError(f"weight must have at least one row and one column, got shape {list(weight.shape)}")
        stored, scales = quant.encode(weight, weight_dtype)
        self._create(stored, scales, weight.shape[1], weight_dtype, threads, lib)

    @classmethod
    def from_encoded(cls, stored, scales, cols, *, weight_dtype, threads=None, lib=None) -> "Linear":
        """From weights already in `weight_dtype` (colibri.quant.encode's pair), cols the
        unpacked row length (int4g32 and int4 rows are bytes: quant.stored_width)."""
        if weight_dtype not in quant.DTYPES:
            raise ValueError(f"weight_dtype must be one of {quant.DTYPES}, got {weight_dtype!r}")
        cols = positive_int("cols", cols)
        want = quant.STORED_DTYPES[weight_dtype]
        if not isinstance(stored, np.ndarray) or stored.dtype != want or stored.ndim != 2:
            raise TypeError(f"stored must be a 2-D {np.dtype(want).name} array for {weight_dtype}")
        rows = stored.shape[0]
        if rows < 1:
            raise ValueError("stored must have at least one row")
        width = quant.stored_width(weight_dtype, cols)
        if stored.shape[1] != width or not stored.flags.c_contiguous:
            raise ValueError(f"stored must be C-contiguous with shape {[rows, width]}")
        want_scales = quant.scales_shape(weight_dtype, (rows,), cols)
        if want_scales is not None:
            f32_array("scales", scales, want_scales)
        elif scales is not None:
            raise TypeError(f"{weight_dtype} weights have no scales (got an array)")
        self = cls.__new__(cls)
        self._create(stored, scales, cols, weight_dtype, threads, lib)
        return self

    def _create(self, stored, scales, cols, weight_dtype, threads, lib):
        self._ptr = None
        self._lock = threading.Lock()
        self.threads = 0 if threads is None else positive_int("threads", threads, maximum=MAX_THREADS)
        self.rows, self.cols, self.weight_dtype = int(stored.shape[0]), int(cols), weight_dtype
        self._lib = lib = open_library(lib)
        ptr = lib.colibri_dense_create(self.rows, self.cols, quant.DTYPE_CODES[weight_dtype],
                                       ffi.from_buffer(stored),
                                       ffi.NULL if scales is None else ffi.from_buffer("float[]", scales))
        if ptr == ffi.NULL:
            check(lib, 1, "colibri_dense_create")
        self._ptr = ffi.gc(ptr, lib.colibri_dense_free)

    @property
    def closed(self) -> bool:
        return self._ptr is None

    @property
    def weight_bytes(self) -> int:
        return int(self._lib.colibri_dense_weight_bytes(self._live()))

    def _live(self):
        if self._ptr is None:
            raise ValueError("the Linear is closed")
        return self._ptr

    def __call__(self, x, out=None):
        x = f32_array("x", x, (None, self.cols))
        T = x.shape[0]
        if out is None:
            out = np.empty((T, self.rows), np.float32)
        else:
            out = f32_array("out", out, (T, self.rows), writeable=True)
            if np.shares_memory(x, out):
                raise ValueError("out must not overlap x")
        if T > _INT_MAX:
            raise ValueError(f"T = {T} tokens is more than the engine takes ({_INT_MAX})")
        with self._lock:
            ptr = self._live()
            if T == 0:
                return out
            check(self._lib, self._lib.colibri_dense_forward(
                ptr, ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", out, require_writable=True),
                T, self.threads), "colibri_dense_forward")
        return out

    def _forward_ptrs(self, x_addr: int, out_addr: int, T: int, bf16: bool = False) -> None:
        """W x into out for T tokens, by address: x float32 [T, cols], out float32 [T, rows],
        C-contiguous, not overlapping; with bf16=True bf16 rows (uint16 bits) in and out
        (colibri_dense_forward_bf16). None of __call__'s checks (MoELayer._forward_ptrs)."""
        if not 0 <= T <= _INT_MAX:
            raise ValueError(f"T = {T} tokens is outside what the engine takes (0..{_INT_MAX})")
        with self._lock:
            ptr = self._live()
            if T and bf16:
                check(self._lib, self._lib.colibri_dense_forward_bf16(
                    ptr, ffi.cast("uint16_t *", x_addr), ffi.cast("uint16_t *", out_addr), T, self.threads),
                    "colibri_dense_forward_bf16")
            elif T:
                check(self._lib, self._lib.colibri_dense_forward(
                    ptr, ffi.cast("float *", x_addr), ffi.cast("float *", out_addr), T, self.threads),
                    "colibri_dense_forward")

    def close(self) -> None:
        with self._lock:
            ptr, self._ptr = self._ptr, None
            if ptr is not None:
                ffi.release(ptr)

    def __enter__(self) -> "Linear":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
