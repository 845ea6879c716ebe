"""Reading and writing the safetensors format, without the `safetensors` package.

Layout of a file (https://github.com/huggingface/safetensors, "Format"):

    8 bytes      N, the header length, unsigned little-endian
    N bytes      JSON object: {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
                               "__metadata__": {str: str}}   (may be padded with spaces)
    the rest     the data; data_offsets are relative to its start, little-endian, row-major

`SafetensorsFile` maps the file read-only and checks the whole header when it opens
(so a broken file fails before any work is done, with the file and tensor named);
tensors are then views of the mapping, copied only to convert their dtype.
`save_safetensors` writes such a file (tests and small tools).
"""
from __future__ import annotations

import json
import math
import mmap
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from . import quant

# safetensors dtype -> numpy dtype of the stored bytes. BF16 has no numpy dtype: its bit
# patterns are read as uint16 and widened (an f32 is bf16 << 16). The 8-bit floats are kept
# as raw bytes so their sizes can be checked; they are not converted.
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"), "U8": np.dtype("u1"), "I8": np.dtype("i1"),
    "F8_E4M3": np.dtype("u1"), "F8_E5M2": np.dtype("u1"),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "U32": np.dtype("<u4"), "I32": np.dtype("<i4"), "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"), "I64": np.dtype("<i8"), "F64": np.dtype("<f8"),
}
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # what to_float32 converts
HEADER_LEN_BYTES = 8
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the reference implementation's limit; refuses absurd N

# numpy dtype -> safetensors dtype for the writer
_FROM_NUMPY = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
               np.dtype(np.float64): "F64", np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8",
               np.dtype(np.int16): "I16", np.dtype(np.uint16): "U16", np.dtype(np.int32): "I32",
               np.dtype(np.uint32): "U32", np.dtype(np.int64): "I64", np.dtype(np.uint64): "U64",
               np.dtype(np.bool_): "BOOL"}


class SafetensorsError(ValueError):
    """A malformed safetensors file or a tensor that cannot be used; names the file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str            # safetensors dtype, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int            # byte offsets relative to the start of the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_header(raw: bytes, data_bytes: int, where: str) -> tuple[dict[str, TensorInfo], dict]:
    """Check a header (the N JSON bytes) against a data section of data_bytes.
    -> ({name: TensorInfo}, metadata). Raises SafetensorsError naming `where` and the tensor."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"{where}: the header is not UTF-8 ({e})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SafetensorsError(f"{where}: the header is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise SafetensorsError(f"{where}: the header must be a JSON object, got "
                               f"{type(obj).__name__}")
    meta = obj.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise SafetensorsError(f"{where}: __metadata__ must be an object of strings")
    tensors: dict[str, TensorInfo] = {}
    for name, ent in obj.items():
        at = f"{where}: tensor {name!r}"
        if not isinstance(ent, dict):
            raise SafetensorsError(f"{at}: the entry must be an object, got {type(ent).__name__}")
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in ent]
        if missing:
            raise SafetensorsError(f"{at}: the entry lacks {', '.join(missing)}")
        dtype, shape, offs = ent["dtype"], ent["shape"], ent["data_offsets"]
        if dtype not in DTYPES:
            raise SafetensorsError(f"{at}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise SafetensorsError(f"{at}: shape must be a list of non-negative integers, "
                                   f"got {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs)
                or not 0 <= offs[0] <= offs[1]):
            raise SafetensorsError(f"{at}: data_offsets must be [begin, end] with "
                                   f"0 <= begin <= end, got {offs!r}")
        if offs[1] > data_bytes:
            raise SafetensorsError(f"{at}: data_offsets {offs} end past the data section "
                                   f"({data_bytes} bytes): the file is truncated or corrupt")
        want = math.prod(shape) * DTYPES[dtype].itemsize
        if offs[1] - offs[0] != want:
            raise SafetensorsError(f"{at}: data_offsets {offs} span {offs[1] - offs[0]} bytes, but "
                                   f"shape {shape} of {dtype} needs {want}")
        tensors[name] = TensorInfo(name, dtype, tuple(shape), offs[0], offs[1])
    # Overlap: sorted by start, each tensor must end before the next begins (empty ones aside).
    spans = sorted((t for t in tensors.values() if t.nbytes), key=lambda t: (t.begin, t.end))
    for a, b in zip(spans, spans[1:]):
        if b.begin < a.end:
            raise SafetensorsError(f"{where}: tensors {a.name!r} [{a.begin}, {a.end}) and "
                                   f"{b.name!r} [{b.begin}, {b.end}) overlap")
    return tensors, meta


class SafetensorsFile:
    """A safetensors file mapped read-only. Use as a context manager or close() it.

        with SafetensorsFile("model.safetensors") as f:
            w = f.to_float32("model.layers.0.mlp.gate.weight")
    """

    def __init__(self, path):
        self.path = Path(path)
        where = str(self.path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise SafetensorsError(f"{where}: cannot open: {e.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_LEN_BYTES:
                raise SafetensorsError(f"{where}: {size} bytes, shorter than the 8-byte header "
                                       f"length: not a safetensors file")
            n = int.from_bytes(os.pread(fd, HEADER_LEN_BYTES, 0), "little")
            if n > MAX_HEADER_BYTES:
                raise SafetensorsError(f"{where}: header length {n} is over the "
                                       f"{MAX_HEADER_BYTES}-byte limit: not a safetensors file")
            if HEADER_LEN_BYTES + n > size:
                raise SafetensorsError(f"{where}: header length {n} runs past the end of the "
                                       f"file ({size} bytes): truncated or not a safetensors file")
            raw = os.pread(fd, n, HEADER_LEN_BYTES)
            self._data_start = HEADER_LEN_BYTES + n
            self.tensors, self.metadata = parse_header(raw, size - self._data_start, where)
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)

    # ---- lookup
    def __contains__(self, name) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r}") from None

    # ---- data
    def raw(self, name: str) -> np.ndarray:
        """The stored elements as a read-only view of the mapping (BF16 as uint16 bit patterns,
        8-bit floats as uint8)."""
        t = self.info(name)
        if self._mm is None:
            raise ValueError(f"{self.path}: the file is closed")
        dt = DTYPES[t.dtype]
        return np.frombuffer(self._mm, dt, math.prod(t.shape),
                             self._data_start + t.begin).reshape(t.shape)

    def to_float32(self, name: str) -> np.ndarray:
        """The tensor as float32: a view for F32, a converted copy for F16, BF16 and F64."""
        t = self.info(name)
        if t.dtype not in FLOAT_DTYPES:
            raise SafetensorsError(f"{self.path}: tensor {name!r} has dtype {t.dtype}; only "
                                   f"{', '.join(FLOAT_DTYPES)} convert to float32")
        return raw_to_float32(self.raw(name), t.dtype)

    def close(self) -> None:
        mm, self._mm = getattr(self, "_mm", None), None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # Arrays still view the mapping; it is unmapped when the last one goes.
                pass

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SafetensorsFile({str(self.path)!r}, {len(self.tensors)} tensors)"


def raw_to_float32(a: np.ndarray, dtype: str) -> np.ndarray:
    """Stored elements (SafetensorsFile.raw, or a slice of it) of a float dtype -> float32.
    F32 on a little-endian host comes back as the same view, uncopied."""
    if dtype == "BF16":
        return quant.from_bf16(a)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype {dtype} does not convert to float32")
    return a.astype(np.float32, copy=False)


def save_safetensors(path, tensors: Mapping[str, np.ndarray], *,
                     metadata: Mapping[str, str] | None = None,
                     dtype: str | Mapping[str, str] | None = None) -> None:
    """Write `tensors` ({name: array}) to `path` atomically.

    The stored dtype follows the array's (float32 -> F32, float16 -> F16, ...) unless
    `dtype` names one: a string for every floating tensor, or {name: dtype}. "BF16" rounds
    float arrays to bfloat16 (nearest, ties to even); F16/F32/F64 cast."""
    if metadata is not None and (not isinstance(metadata, Mapping)
                                 or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in metadata.items())):
        raise TypeError("metadata must map str to str")
    header: dict = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    blobs: list[bytes] = []
    offset = 0
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"tensor name must be a str other than '__metadata__', got {name!r}")
        a = np.asarray(value)
        want = dtype.get(name) if isinstance(dtype, Mapping) else (
            dtype if dtype is not None and np.issubdtype(a.dtype, np.floating) else None)
        if want is None:
            if a.dtype not in _FROM_NUMPY:
                raise TypeError(f"tensor {name!r}: no safetensors dtype for numpy {a.dtype}")
            want = _FROM_NUMPY[a.dtype]
        if want not in DTYPES:
            raise ValueError(f"tensor {name!r}: unknown dtype {want!r}")
        if want == "BF16":
            if not np.issubdtype(a.dtype, np.floating):
                raise TypeError(f"tensor {name!r}: BF16 needs a float array, got {a.dtype}")
            stored = quant.to_bf16(a).astype("<u2")
        elif want in ("F8_E4M3", "F8_E5M2"):
            raise ValueError(f"tensor {name!r}: writing {want} is not supported")
        else:
            stored = np.ascontiguousarray(a, dtype=DTYPES[want])
        data = stored.tobytes()
        header[name] = {"dtype": want, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keeps the data section 8-byte aligned, as the spec advises
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(text).to_bytes(HEADER_LEN_BYTES, "little"))
            f.write(text)
            for b in blobs:
                f.write(b)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
