"""Weight formats: f32 -> bf16, int8 (symmetric, one scale per row), int4g32
(symmetric, one scale per group of 32 along a row, packed for the kernel) and int4
(4.5 bits per weight: per group of 32 a 6-bit scale and min, f16 super-block scales),
and back.

One implementation, used by the layer binding and the model-file writer, so the
bytes the engine streams are the bytes the tests dequantize.
"""
from __future__ import annotations

import numpy as np

DTYPES = ("f32", "bf16", "int8", "int4g32", "int4")
DTYPE_CODES = {"f32": 0, "bf16": 1, "int8": 2, "int4g32": 3, "int4": 4}
STORED_DTYPES = {"f32": np.float32, "bf16": np.uint16, "int8": np.int8, "int4g32": np.uint8,
                 "int4": np.uint8}

# Worst-case element error of each format, as a bound the tests check:
# bf16 keeps 8 significant bits (7 stored), so round-to-nearest errs by at most 2^-8 relative;
# int8 errs by at most half a step, scale / 2, with scale = max|row| / 127.
# int4g32 errs by at most half a step of its group, scale / 2, with scale = max|group| / 7.
BF16_REL_ERR = 2.0 ** -8

# int4g32: groups of INT4_GROUP weights along a row (the last one zero-padded), one f32
# scale each; q = rint(w / scale) in [-7, 7] stored as the nibble q + 8. Group g of a
# row is 16 bytes: byte j holds weight j in its low nibble and weight 16 + j in its
# high nibble, so one 16-byte load and a mask/shift give two runs of 16 weights that
# line up with 16 consecutive activations each (see templates/expert_ffn.c.j2).
# The int8 and int4g32 kernels also quantize the activations they multiply, per group of
# 32, to int8 (scale = max|x_group| / 127) and accumulate exact integer dot products
# per group (VNNI vpdpbusd where the target has it).
INT4_GROUP = 32


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


# rows per slice of the quantizers: their temporaries stay in cache (a Mixtral matrix
# quantized whole made a dozen passes over 235 MB arrays)
_ROWS_PER_SLICE = 256


def _row_slices(n: int):
    return (slice(i, min(i + _ROWS_PER_SLICE, n)) for i in range(0, n, _ROWS_PER_SLICE))


def quantize_int8(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., rows, cols] float32 -> (int8 same shape, float32 scales [..., rows])."""
    a = np.asarray(a, dtype=np.float32)
    flat = a.reshape(-1, a.shape[-1])
    q8 = np.empty(flat.shape, np.int8)
    scales = np.empty(flat.shape[0], np.float32)
    for sl in _row_slices(flat.shape[0]):
        sc = (np.max(np.abs(flat[sl]), axis=-1) / np.float32(127.0)).astype(np.float32)
        scales[sl] = sc
        q = flat[sl] / np.where(sc > 0, sc, np.float32(1.0))[:, None]
        np.rint(q, out=q)
        np.clip(q, -127, 127, out=q)
        q8[sl] = q
    return q8.reshape(a.shape), scales.reshape(a.shape[:-1])


def dequantize_int8(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) * scales[..., None]


def int4_groups(cols: int) -> int:
    return -(-cols // INT4_GROUP)


def quantize_int4(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., rows, cols] float32 -> (packed uint8 [..., rows, groups * 16],
    float32 scales [..., rows, groups]), groups = ceil(cols / 32)."""
    a = np.asarray(a, dtype=np.float32)
    cols = a.shape[-1]
    ng = int4_groups(cols)
    lead = a.shape[:-1]
    flat = a.reshape(-1, cols)
    packed = np.empty((flat.shape[0], ng, 16), np.uint8)
    scales = np.empty((flat.shape[0], ng), np.float32)
    for sl in _row_slices(flat.shape[0]):
        g = flat[sl]
        if ng * INT4_GROUP != cols:
            g = np.concatenate([g, np.zeros((g.shape[0], ng * INT4_GROUP - cols), np.float32)], axis=-1)
        g = g.reshape(-1, ng, INT4_GROUP)
        sc = (np.max(np.abs(g), axis=-1) / np.float32(7.0)).astype(np.float32)
        scales[sl] = sc
        q = g / np.where(sc > 0, sc, np.float32(1.0))[..., None]
        np.rint(q, out=q)
        np.clip(q, -7, 7, out=q)
        n = (q.astype(np.int8) + np.int8(8)).view(np.uint8)  # nibble 1..15
        packed[sl] = n[..., :16] | (n[..., 16:] << np.uint8(4))
    return packed.reshape(lead + (ng * 16,)), scales.reshape(lead + (ng,))


def dequantize_int4(packed: np.ndarray, scales: np.ndarray, cols: int) -> np.ndarray:
    """The float32 weights [..., rows, cols] of quantize_int4's output."""
    packed = np.asarray(packed, dtype=np.uint8)
    ng = scales.shape[-1]
    b = packed.reshape(packed.shape[:-1] + (ng, 16))
    q = np.concatenate([b & 15, b >> 4], axis=-1).astype(np.float32) - 8
    w = (q * scales[..., None]).reshape(packed.shape[:-1] + (ng * INT4_GROUP,))
    return np.ascontiguousarray(w[..., :cols])


# int4: a row is super-blocks of up to INT4K_SUPER groups of 32, each a 16-byte header
# and then its groups' 16 bytes of nibbles q (0..15, int4g32's byte order); a group's weights
# are d * sc * q - dmin * mn. Header words h0..h3 (little-endian uint32) hold 16 six-bit
# codes, c = j group j's sc and c = 8 + j its mn: code c < 15 is bits 6 (c % 5).. of
# h[c // 5], code 15 the top two bits of h0, h1, h2 (its bits 0-1, 2-3, 4-5); h3 is f16 d
# (low half) and f16 dmin (high half). kernels/internal.h and FORMAT.md say the same; the
# fit is C's (kernels/int4k.c, colibri_quantize_int4k). The int4 kernels quantize their
# activations per super-block (quantize_activations with group 256), as ggml's q8_K.
INT4K_SUPER = 8


def int4k_row_bytes(cols: int) -> int:
    ng = int4_groups(cols)
    return 16 * (-(-ng // INT4K_SUPER) + ng)


def quantize_int4k(a: np.ndarray, lib=None) -> np.ndarray:
    """[..., rows, cols] float32 -> uint8 [..., rows, int4k_row_bytes(cols)] (in C: the
    fit runs on the library's threads)."""
    from ._lib import check, ffi, open_library  # the fit is the engine's
    a = np.ascontiguousarray(a, dtype=np.float32)
    cols = a.shape[-1]
    flat = a.reshape(-1, cols)
    out = np.empty((flat.shape[0], int4k_row_bytes(cols)), np.uint8)
    if flat.shape[0]:
        lib = open_library(lib)
        check(lib, lib.colibri_quantize_int4k(ffi.from_buffer("float[]", flat), flat.shape[0], cols,
                                              ffi.from_buffer("uint8_t[]", out, require_writable=True), 0),
              "colibri_quantize_int4k")
    return out.reshape(a.shape[:-1] + (out.shape[-1],))


def dequantize_int4k(stored: np.ndarray, cols: int) -> np.ndarray:
    """The float32 weights [..., rows, cols] of quantize_int4k's output."""
    stored = np.asarray(stored, dtype=np.uint8)
    lead = stored.shape[:-1]
    rows = stored.reshape(-1, stored.shape[-1])
    ng = int4_groups(cols)
    nsb = -(-ng // INT4K_SUPER)
    if rows.shape[1] != int4k_row_bytes(cols):
        raise ValueError(f"int4 rows of {cols} weights are {int4k_row_bytes(cols)} bytes, got {rows.shape[1]}")
    w = np.empty((rows.shape[0], ng * INT4_GROUP), np.float32)
    at = 0
    for sb in range(nsb):
        n = min(INT4K_SUPER, ng - sb * INT4K_SUPER)
        h = rows[:, at:at + 16].copy().view("<u4")                       # [rows, 4]
        d = (h[:, 3] & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
        dmin = (h[:, 3] >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
        codes = [h[:, c // 5] >> np.uint32(6 * (c % 5)) & 63 for c in range(15)]
        codes.append(h[:, 0] >> 30 | (h[:, 1] >> 30) << 2 | (h[:, 2] >> 30) << 4)
        sc = np.stack(codes[:n], axis=1)                                 # [rows, n]
        mn = np.stack(codes[INT4K_SUPER:INT4K_SUPER + n], axis=1)
        b = rows[:, at + 16:at + 16 + 16 * n].reshape(-1, n, 16)
        q = np.concatenate([b & 15, b >> 4], axis=-1).astype(np.float32)  # [rows, n, 32]
        a_ = (d[:, None] * sc.astype(np.float32))[..., None]
        m_ = (dmin[:, None] * mn.astype(np.float32))[..., None]
        k0 = sb * INT4K_SUPER * INT4_GROUP
        w[:, k0:k0 + n * INT4_GROUP] = (a_ * q - m_).reshape(rows.shape[0], -1)
        at += 16 + 16 * n
    return np.ascontiguousarray(w[:, :cols].reshape(lead + (cols,)))


def quantize_activations(x: np.ndarray, group: int = INT4_GROUP) -> np.ndarray:
    """What the int8 and int4g32 kernels multiply instead of x [..., cols]: x quantized to
    int8 per group of 32 (scale = max|group| / 127, round to nearest even) and scaled back,
    in the same float32 operations as the C code (templates/expert_ffn/quant.j2,
    act_quant_group); int4's kernels do the same per super-block of 256 (group=256)."""
    x = np.asarray(x, dtype=np.float32)
    cols = x.shape[-1]
    ng = -(-cols // group)
    pad = ng * group - cols
    xp = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), np.float32)], axis=-1) if pad else x
    g = xp.reshape(x.shape[:-1] + (ng, group))
    amax = np.max(np.abs(g), axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        q = np.clip(np.rint(g * inv), -127, 127)
    sc = (amax / np.float32(127.0)).astype(np.float32)
    out = (q * sc).reshape(xp.shape)[..., :cols]
    return np.ascontiguousarray(out, dtype=np.float32)


# What the kernels of a dtype do to activations before each matrix (the reference
# applies the same to compare arithmetic, not formats).
ACTIVATION_ROUNDING = {"int8": quantize_activations, "int4g32": quantize_activations,
                       "int4": lambda x: quantize_activations(x, INT4K_SUPER * INT4_GROUP)}


def stored_bytes(dtype: str, rows: int, cols: int) -> int:
    """Bytes the engine streams for one [rows, cols] matrix: data plus its scales."""
    if dtype == "int4g32":
        return rows * int4_groups(cols) * (16 + 4)
    if dtype == "int4":
        return rows * int4k_row_bytes(cols)
    if dtype == "int8":
        return rows * cols + rows * 4
    return rows * cols * {"f32": 4, "bf16": 2}[dtype]


def stored_width(dtype: str, cols: int) -> int:
    """The last dimension of a stored [rows, cols] matrix: int4g32 and int4 rows are bytes."""
    if dtype == "int4g32":
        return int4_groups(cols) * 16
    if dtype == "int4":
        return int4k_row_bytes(cols)
    return cols


def scales_shape(dtype: str, lead: tuple, cols: int) -> tuple | None:
    """The shape of the scales of stored weights [*lead, cols]; None: the dtype has none."""
    if dtype == "int8":
        return tuple(lead)
    if dtype == "int4g32":
        return tuple(lead) + (int4_groups(cols),)
    return None


def encode(a: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """float32 weights -> (stored array, int8 scales or None)."""
    if dtype == "f32":
        return np.ascontiguousarray(a, dtype=np.float32), None
    if dtype == "bf16":
        return to_bf16(a), None
    if dtype == "int8":
        q, s = quantize_int8(a)
        return np.ascontiguousarray(q), np.ascontiguousarray(s)
    if dtype == "int4g32":
        q, s = quantize_int4(a)
        return np.ascontiguousarray(q), np.ascontiguousarray(s)
    if dtype == "int4":
        return quantize_int4k(a), None
    raise ValueError(f"weight_dtype must be one of {DTYPES}, got {dtype!r}")


def decode(stored: np.ndarray, scales: np.ndarray | None, dtype: str,
           cols: int | None = None) -> np.ndarray:
    """The float32 weights the engine computes with (int4g32 and int4 need the row length, cols)."""
    if dtype == "f32":
        return np.asarray(stored, dtype=np.float32)
    if dtype == "bf16":
        return from_bf16(stored)
    if dtype == "int8":
        return dequantize_int8(stored, scales)
    if dtype == "int4g32":
        return dequantize_int4(stored, scales, cols)
    if dtype == "int4":
        return dequantize_int4k(stored, cols)
    raise ValueError(f"weight_dtype must be one of {DTYPES}, got {dtype!r}")


def roundtrip(a: np.ndarray, dtype: str) -> np.ndarray:
    """a as the engine sees it after conversion to dtype."""
    return decode(*encode(a, dtype), dtype, cols=np.shape(a)[-1])


class PerExpert:
    """[E, ...] weights seen in `dtype`, converted per expert on access.

    The reference touches only the routed experts, so converting all of a large
    model up front would be wasted work."""

    def __init__(self, a: np.ndarray, dtype: str):
        self.a, self.dtype = a, dtype

    def __getitem__(self, e: int) -> np.ndarray:
        return roundtrip(self.a[e], self.dtype)
