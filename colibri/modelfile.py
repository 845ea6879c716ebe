"""Writing and reading Colibri model files (format v2, reads v1 too; FORMAT.md).

`save_model` writes a stack of MoE layers that share one set of dimensions;
`read_header` and `read_layers` read a file back in pure Python (for tests and
inspection; the engine's own loader is kernels/model.c). The byte offsets of
every header and tensor-entry field are exported (`HEADER_FIELDS`,
`TENSOR_FIELDS`, `field_offsets()`) together with small helpers to patch a field
and re-seal the header CRC, so a test can corrupt one precise field.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import quant

MAGIC = 0xCAFE1234
VERSION = 2  # written; v2 adds weight dtype 4 (int4). Read: 1 and 2
MIN_VERSION = 1
HEADER_BYTES = 128
HEADER_CRC_BYTES = 104  # the header CRC covers bytes 0 .. 103
TENSOR_ENTRY_BYTES = 48
ABSENT = 0xFFFFFFFF

MAX_LAYERS = 65536
MAX_DIM = 1048576
MAX_EXPERTS = 4096
MIN_ALIGNMENT = 64
MAX_ALIGNMENT = 2097152

# name -> (byte offset, struct format), FORMAT.md "Header".
HEADER_FIELDS: dict[str, tuple[int, str]] = {
    "magic": (0, "<I"),
    "version": (4, "<I"),
    "header_bytes": (8, "<I"),
    "n_layers": (12, "<I"),
    "hidden": (16, "<I"),
    "inter": (20, "<I"),
    "n_experts": (24, "<I"),
    "top_k": (28, "<I"),
    "scoring": (32, "<I"),
    "norm_topk_prob": (36, "<I"),
    "dyn_p": (40, "<f"),
    "k_min": (44, "<I"),
    "k_max": (48, "<I"),
    "weight_dtype": (52, "<I"),
    "shared_inter": (56, "<I"),
    "shared_gated": (60, "<I"),
    "alignment": (64, "<I"),
    "n_tensors": (68, "<I"),
    "slot_table_offset": (72, "<Q"),
    "tensor_table_offset": (80, "<Q"),
    "data_offset": (88, "<Q"),
    "file_size": (96, "<Q"),
    "header_crc32": (104, "<I"),
}
HEADER_RESERVED = (108, 20)  # offset, length: must be zero

# name -> (byte offset within the 48-byte entry, struct format), FORMAT.md "Tensor table entry".
TENSOR_FIELDS: dict[str, tuple[int, str]] = {
    "kind": (0, "<I"),
    "dtype": (4, "<I"),
    "rows": (8, "<Q"),
    "cols": (16, "<Q"),
    "offset": (24, "<Q"),
    "nbytes": (32, "<Q"),
    "crc32": (40, "<I"),
    "reserved": (44, "<I"),
}

KIND_NAMES = ("router", "gate", "up", "down", "shared_gate", "shared_up", "shared_down",
              "shared_expert_gate")
KIND = {name: i for i, name in enumerate(KIND_NAMES)}
SCORING = {"softmax": 0, "softmax_topk": 1}
SCORING_NAMES = {v: k for k, v in SCORING.items()}
DTYPE_NAMES = quant.DTYPES  # code -> name: ("f32", "bf16", "int8", "int4g32", "int4")

_HEADER = struct.Struct("<10If7I4QI20x")
_ENTRY = struct.Struct("<IIQQQQII")
assert _HEADER.size == HEADER_BYTES and _ENTRY.size == TENSOR_ENTRY_BYTES


def field_offsets() -> dict[str, dict[str, int]]:
    """{"header": {field: byte offset}, "tensor": {field: offset within an entry}}."""
    return {"header": {k: v[0] for k, v in HEADER_FIELDS.items()},
            "tensor": {k: v[0] for k, v in TENSOR_FIELDS.items()}}


def slots_per_layer(n_experts: int) -> int:
    return 1 + 3 * n_experts + 4


def slot_index(n_experts: int, slot: str, expert: int | None = None) -> int:
    """Position j of a slot within a layer: slot in KIND_NAMES (expert needed for gate/up/down)."""
    kind = KIND[slot]
    if kind == 0:
        return 0
    if kind <= 3:
        if expert is None or not 0 <= expert < n_experts:
            raise ValueError(f"slot {slot!r} needs an expert index in [0, {n_experts})")
        return 1 + 3 * expert + (kind - 1)
    return 1 + 3 * n_experts + (kind - 4)


def slot_offset(header: dict, layer: int, j: int) -> int:
    """Absolute byte offset of slot j of a layer."""
    return header["slot_table_offset"] + 4 * (layer * header["slots_per_layer"] + j)


def tensor_field_offset(header: dict, index: int, field: str) -> int:
    """Absolute byte offset of a field of tensor-table entry `index`."""
    return header["tensor_table_offset"] + TENSOR_ENTRY_BYTES * index + TENSOR_FIELDS[field][0]


def patch(buf: bytearray, offset: int, fmt: str, value) -> None:
    """Write one little-endian value into buf at offset."""
    struct.pack_into(fmt, buf, offset, value)


def patch_header(buf: bytearray, field: str, value, *, reseal: bool = True) -> None:
    """Set a header field; re-seal the header CRC unless reseal=False."""
    off, fmt = HEADER_FIELDS[field]
    struct.pack_into(fmt, buf, off, value)
    if reseal and field != "header_crc32":
        reseal_header(buf)


def reseal_header(buf: bytearray) -> None:
    """Recompute header_crc32 over bytes 0 .. 103."""
    struct.pack_into("<I", buf, HEADER_FIELDS["header_crc32"][0],
                     zlib.crc32(bytes(buf[:HEADER_CRC_BYTES])))


# ------------------------------------------------------------------ writing

_LAYER_KEYS = {"router", "gate", "up", "down", "top_k", "scoring", "norm_topk_prob", "dyn_p",
               "k_min", "k_max", "shared_gate", "shared_up", "shared_down", "shared_expert_gate"}
_SHARED_KEYS = ("shared_gate", "shared_up", "shared_down")


def _float_array(where: str, v) -> np.ndarray:
    a = np.asarray(v)
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{where} must be a float32 array, got dtype {a.dtype}")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{where} holds NaN or infinite values")
    return a


def _shape_check(where: str, a: np.ndarray, shape: tuple[int, ...], names: str) -> None:
    if a.shape != shape:
        raise ValueError(f"{where} must have shape [{names}] = {list(shape)}, got {list(a.shape)}")


def _int_field(where: str, v, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{where} must be an int, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{where} = {v} is out of range [{lo}, {hi}]")
    return int(v)


def _check_layer(i: int, d: dict) -> tuple[dict, dict]:
    """-> (float32 arrays, config) of one layer dict, all checked."""
    w = f"layers[{i}]"
    if not isinstance(d, dict):
        raise TypeError(f"{w} must be a dict, got {type(d).__name__}")
    unknown = set(d) - _LAYER_KEYS
    if unknown:
        raise ValueError(f"{w} has unknown keys {sorted(unknown)}; expected some of {sorted(_LAYER_KEYS)}")
    for k in ("router", "gate", "up", "down"):
        if d.get(k) is None:
            raise ValueError(f"{w} is missing {k!r}")
    arr = {k: _float_array(f"{w}[{k!r}]", d[k]) for k in ("router", "gate", "up", "down")}
    router = arr["router"]
    if router.ndim != 2:
        raise ValueError(f"{w}['router'] must be 2-D [E, H], got shape {list(router.shape)}")
    E, H = router.shape
    if arr["gate"].ndim != 3:
        raise ValueError(f"{w}['gate'] must be 3-D [E, I, H], got shape {list(arr['gate'].shape)}")
    I = arr["gate"].shape[1]
    _int_field(f"{w} n_experts (router rows)", E, 1, MAX_EXPERTS)
    _int_field(f"{w} hidden (router cols)", H, 1, MAX_DIM)
    _int_field(f"{w} inter (gate.shape[1])", I, 1, MAX_DIM)
    _shape_check(f"{w}['gate']", arr["gate"], (E, I, H), "E, I, H")
    _shape_check(f"{w}['up']", arr["up"], (E, I, H), "E, I, H")
    _shape_check(f"{w}['down']", arr["down"], (E, H, I), "E, H, I")

    have = [d.get(k) is not None for k in _SHARED_KEYS]
    S = 0
    if any(have):
        if not all(have):
            raise ValueError(f"{w}: a shared expert needs all of {list(_SHARED_KEYS)}")
        for k in _SHARED_KEYS:
            arr[k] = _float_array(f"{w}[{k!r}]", d[k])
        if arr["shared_gate"].ndim != 2:
            raise ValueError(f"{w}['shared_gate'] must be 2-D [S, H]")
        S = _int_field(f"{w} shared_inter (shared_gate.shape[0])", arr["shared_gate"].shape[0], 1,
                       MAX_DIM)
        _shape_check(f"{w}['shared_gate']", arr["shared_gate"], (S, H), "S, H")
        _shape_check(f"{w}['shared_up']", arr["shared_up"], (S, H), "S, H")
        _shape_check(f"{w}['shared_down']", arr["shared_down"], (H, S), "H, S")
    gated = d.get("shared_expert_gate") is not None
    if gated:
        if not S:
            raise ValueError(f"{w}: shared_expert_gate given without a shared expert")
        seg = _float_array(f"{w}['shared_expert_gate']", d["shared_expert_gate"])
        if seg.shape not in ((H,), (1, H)):
            raise ValueError(f"{w}['shared_expert_gate'] must have shape [H] = [{H}], "
                             f"got {list(seg.shape)}")
        arr["shared_expert_gate"] = seg.reshape(1, H)

    scoring = d.get("scoring", "softmax")
    if scoring not in SCORING:
        raise ValueError(f"{w}['scoring'] must be one of {sorted(SCORING)}, got {scoring!r}")
    dyn_p = float(np.float32(d.get("dyn_p") or 0.0))  # the file holds an f32
    if not (dyn_p == 0.0 or 0.0 < dyn_p <= 1.0):
        raise ValueError(f"{w}['dyn_p'] must be 0 (fixed top-k) or in (0, 1], got {d.get('dyn_p')}")
    if dyn_p > 0:
        k_min = _int_field(f"{w}['k_min']", d.get("k_min", 1), 1, E)
        top_k = d.get("top_k")
        top_k = None if top_k is None else _int_field(f"{w}['top_k']", top_k, 1, E)
        k_max = d.get("k_max")
        if k_max is None:  # as MoELayer: top_k bounds the count, else every expert may be chosen
            k_max = E if top_k is None else max(top_k, k_min)
        k_max = _int_field(f"{w}['k_max']", k_max, k_min, E)
        top_k = k_max if top_k is None else top_k
    else:
        for k in ("k_min", "k_max"):
            if d.get(k) not in (None, 0):
                raise ValueError(f"{w}[{k!r}] is only meaningful with dyn_p > 0")
        if d.get("top_k") is None:
            raise ValueError(f"{w} is missing 'top_k'")
        top_k = _int_field(f"{w}['top_k']", d["top_k"], 1, E)
        k_min = k_max = 0
    cfg = {"hidden": H, "inter": I, "n_experts": E, "shared_inter": S, "shared_gated": int(gated),
           "top_k": top_k, "scoring": SCORING[scoring],
           "norm_topk_prob": int(bool(d.get("norm_topk_prob", True))), "dyn_p": dyn_p,
           "k_min": k_min, "k_max": k_max}
    return arr, cfg


def _payload(kind: int, a: np.ndarray, wdtype: int) -> tuple[int, bytes]:
    """(dtype code, stored bytes) of one [rows, cols] matrix."""
    if kind in (KIND["router"], KIND["shared_expert_gate"]) or wdtype == 0:
        return 0, a.astype("<f4", copy=False).tobytes()
    if wdtype == 1:
        return 1, quant.to_bf16(a).astype("<u2", copy=False).tobytes()
    if wdtype == 4:  # int4: rows of super-blocks, scales inside
        return 4, np.ascontiguousarray(quant.quantize_int4k(a)).tobytes()
    if wdtype == 3:  # int4g32: packed groups (a multiple of 16 bytes per row), then the scales
        q, s = quant.quantize_int4(a)
        return 3, np.ascontiguousarray(q).tobytes() + np.asarray(s, dtype="<f4").tobytes()
    q, s = quant.quantize_int8(a)
    data = np.ascontiguousarray(q, dtype=np.int8).tobytes()
    pad = (-len(data)) % 4
    return 2, data + b"\0" * pad + np.asarray(s, dtype="<f4").tobytes()


def _align(v: int, a: int) -> int:
    return (v + a - 1) // a * a


def save_model(path, layers: Sequence[dict], *, weight_dtype: str = "f32", alignment: int = 64,
               share: bool = True) -> dict[str, Any]:
    """Write `layers` (a list of layer dicts, see below) to `path` atomically.

    Each layer dict: router [E,H], gate [E,I,H], up [E,I,H], down [E,H,I] (float32);
    top_k; scoring ("softmax" | "softmax_topk", default "softmax"); norm_topk_prob
    (default True); optional dyn_p (> 0: dynamic count) with k_min (default 1) and
    k_max (default top_k, else E); optional shared_gate [S,H], shared_up [S,H], shared_down [H,S]
    and shared_expert_gate [H]. All layers must share dimensions and routing config.

    weight_dtype ("f32" | "bf16" | "int8" | "int4" | "int4g32") applies to expert and shared-expert
    matrices; the router and the shared expert gate stay f32. With share=True,
    identical tensors (same kind and stored bytes, e.g. one expert array reused by
    several layers) are stored once and named by several slots.

    Returns {"path", "n_tensors", "n_slots", "file_size", "payload_bytes"}.
    (ModelWriter writes the same file one layer at a time.)
    """
    writer = ModelWriter(path, weight_dtype=weight_dtype, alignment=alignment, share=share,
                         _remember_sources=True)
    try:
        if isinstance(layers, dict) or not isinstance(layers, Sequence):
            raise TypeError("layers must be a list of layer dicts")
        if not 1 <= len(layers) <= MAX_LAYERS:
            raise ValueError(f"need 1 .. {MAX_LAYERS} layers, got {len(layers)}")
        # Every layer is checked before a byte is written, so a bad last layer costs nothing.
        checked = [_check_layer(i, d) for i, d in enumerate(layers)]
        for i, (_, c) in enumerate(checked):
            writer._check_config(i, c)
        for d, (arr, cfg) in zip(layers, checked):
            writer._add_checked(d, arr, cfg)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


class ModelWriter:
    """Writes a model file one layer at a time, so a large model never has to be in
    memory whole (the checkpoint converter streams layers through it):

        with ModelWriter("m.colibri", weight_dtype="bf16") as w:
            for layer in layers:          # layer dicts as save_model takes them
                w.add_layer(layer)
        info = w.info                     # save_model's summary

    Payloads go to a temporary file beside `path`; close() writes the header and
    tables and moves the file into place atomically; an exception inside the `with`
    (or abort()) leaves nothing behind. share=True stores identical tensors once.

    expect=(n_layers, n_experts), when the caller knows them, reserves room for the
    largest tables those allow, so payloads are written straight into the output
    instead of being copied there at the end (a large model is written once, not
    twice); the unused part of the reservation stays zero, which FORMAT.md allows.
    """

    def __init__(self, path, *, weight_dtype: str = "f32", alignment: int = 64,
                 share: bool = True, expect: tuple[int, int] | None = None,
                 _remember_sources: bool = False):
        if weight_dtype not in quant.DTYPE_CODES:
            raise ValueError(f"weight_dtype must be one of {list(quant.DTYPE_CODES)}, "
                             f"got {weight_dtype!r}")
        alignment = _int_field("alignment", alignment, MIN_ALIGNMENT, MAX_ALIGNMENT)
        if alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self.path = Path(path)
        self._dir = self.path.parent if str(self.path.parent) else Path(".")
        self._wdt = quant.DTYPE_CODES[weight_dtype]
        self._alignment = alignment
        self._share = share
        # Memo by array identity skips re-encoding an array every layer names (save_model's
        # callers reuse arrays); it keeps those arrays alive, so a streaming caller goes without.
        self._remember = share and _remember_sources
        self._cfg: dict | None = None
        self._slots: list[np.ndarray] = []
        self._tensors: list[tuple[int, int, int, int, int, int, int]] = []  # kind dtype rows cols off nbytes crc
        self._by_hash: dict[tuple, int] = {}
        self._by_source: dict[tuple, int] = {}
        self._keep_alive: list = []
        self._expect = None
        self._tmp: str | None = None
        self._base = 0  # where payload offset 0 lies in self._blob
        if expect is not None:
            n_layers = _int_field("expect n_layers", expect[0], 1, MAX_LAYERS)
            n_experts = _int_field("expect n_experts", expect[1], 1, MAX_EXPERTS)
            self._expect = (n_layers, n_experts)
            n_slots = n_layers * slots_per_layer(n_experts)
            table_end = _align(HEADER_BYTES + 4 * n_slots, 8) + TENSOR_ENTRY_BYTES * n_slots
            self._base = _align(table_end, alignment)
            fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                             dir=self._dir)
            self._blob = os.fdopen(fd, "w+b")
        else:
            self._blob = tempfile.TemporaryFile(dir=self._dir)
        self._blob_end = 0
        self.info: dict[str, Any] | None = None

    @property
    def n_layers(self) -> int:
        return len(self._slots)

    def add_layer(self, layer: dict) -> None:
        """Check one layer dict (as save_model takes) and append its tensors."""
        self._live()
        if len(self._slots) >= MAX_LAYERS:
            raise ValueError(f"a model holds at most {MAX_LAYERS} layers")
        if self._expect and len(self._slots) >= self._expect[0]:
            raise ValueError(f"ModelWriter expected {self._expect[0]} layers; this is one more")
        arr, cfg = _check_layer(len(self._slots), layer)
        if self._expect and cfg["n_experts"] != self._expect[1]:
            raise ValueError(f"layers[{len(self._slots)}] has {cfg['n_experts']} experts, but "
                             f"ModelWriter expected {self._expect[1]}")
        self._check_config(len(self._slots), cfg)
        self._add_checked(layer, arr, cfg)

    def repeat_layer(self, i: int = 0) -> None:
        """Append a copy of layer i, as add_layer(the same dict) would, without encoding its
        tensors again: with share=False each tensor's stored bytes are copied from the file
        (a stack of copies of one quantized layer is then written at disk speed), with
        share=True the copy names the same tensors."""
        self._live()
        if not 0 <= i < len(self._slots):
            raise ValueError(f"repeat_layer({i}): the writer holds {len(self._slots)} layer(s)")
        if len(self._slots) >= MAX_LAYERS:
            raise ValueError(f"a model holds at most {MAX_LAYERS} layers")
        if self._expect and len(self._slots) >= self._expect[0]:
            raise ValueError(f"ModelWriter expected {self._expect[0]} layers; this is one more")
        slots = self._slots[i].copy()
        if not self._share:
            for j, t in enumerate(self._slots[i]):
                if t == ABSENT:
                    continue
                kind, dtype, rows, cols, off, nbytes, crc = self._tensors[t]
                self._blob.seek(self._base + off)
                data = self._blob.read(nbytes)
                new = _align(self._blob_end, self._alignment)
                self._blob.seek(self._base + new)
                self._blob.write(data)
                self._blob_end = new + nbytes
                slots[j] = len(self._tensors)
                self._tensors.append((kind, dtype, rows, cols, new, nbytes, crc))
        self._slots.append(slots)

    def _live(self) -> None:
        if self._blob is None:
            raise ValueError(f"ModelWriter for {self.path} is closed")

    def _check_config(self, i: int, cfg: dict) -> None:
        if self._cfg is None:
            self._cfg = cfg
            return
        for k, v in self._cfg.items():
            if cfg[k] != v:
                raise ValueError(f"layers[{i}] has {k} = {cfg[k]}, but layers[0] has {v}: all "
                                 f"layers must share dimensions and routing config")

    def _add(self, slots: np.ndarray, slot: int, kind: int, source, sub, mat: np.ndarray) -> None:
        memo = (id(source), sub, kind)
        if self._remember and memo in self._by_source:
            slots[slot] = self._by_source[memo]
            return
        dtype, data = _payload(kind, mat, self._wdt)
        # hashed only to share identical tensors (a second of a big f32 layer otherwise)
        key = (kind, dtype, mat.shape, hashlib.blake2b(data, digest_size=32).digest()) if self._share else None
        if self._share and key in self._by_hash:
            t = self._by_hash[key]
        else:
            off = _align(self._blob_end, self._alignment)
            self._blob.seek(self._base + off)
            self._blob.write(data)
            self._blob_end = off + len(data)
            t = len(self._tensors)
            self._tensors.append((kind, dtype, mat.shape[0], mat.shape[1], off, len(data),
                                  zlib.crc32(data)))
            if self._share:
                self._by_hash[key] = t
        if self._remember:
            self._by_source[memo] = t
            self._keep_alive.append(source)
        slots[slot] = t

    def _add_checked(self, src: dict, arr: dict, cfg: dict) -> None:
        E, S, gated = cfg["n_experts"], cfg["shared_inter"], cfg["shared_gated"]
        slots = np.full(slots_per_layer(E), ABSENT, dtype="<u4")
        self._add(slots, 0, KIND["router"], src["router"], None, arr["router"])
        for e in range(E):
            for k, name in enumerate(("gate", "up", "down")):
                self._add(slots, 1 + 3 * e + k, KIND[name], src[name], e, arr[name][e])
        if S:
            for k, name in enumerate(_SHARED_KEYS):
                self._add(slots, 1 + 3 * E + k, KIND[name], src[name], None, arr[name])
            if gated:
                self._add(slots, 4 + 3 * E, KIND["shared_expert_gate"],
                          src["shared_expert_gate"], None, arr["shared_expert_gate"])
        self._slots.append(slots)

    def close(self) -> dict[str, Any]:
        """Write the file (header, tables, payloads) and return save_model's summary."""
        if self.info is not None:
            return self.info
        self._live()
        if not self._slots:
            self.abort()
            raise ValueError(f"{self.path}: no layers were added; a model needs at least one")
        cfg, alignment = self._cfg, self._alignment
        n_layers, n_tensors = len(self._slots), len(self._tensors)
        slots = np.concatenate(self._slots)
        n_slots = len(slots)
        slot_off = HEADER_BYTES
        tensor_off = _align(slot_off + 4 * n_slots, 8)
        data_off = _align(tensor_off + TENSOR_ENTRY_BYTES * n_tensors, alignment)
        if self._tmp is not None:
            assert data_off <= self._base  # expect= bounds n_layers and E: the tables fit
            data_off = self._base
        file_size = data_off + self._blob_end
        header = bytearray(_HEADER.pack(
            MAGIC, VERSION, HEADER_BYTES, n_layers, cfg["hidden"], cfg["inter"], cfg["n_experts"],
            cfg["top_k"], cfg["scoring"], cfg["norm_topk_prob"], cfg["dyn_p"], cfg["k_min"],
            cfg["k_max"], self._wdt, cfg["shared_inter"], cfg["shared_gated"], alignment,
            n_tensors, slot_off, tensor_off, data_off, file_size, 0))
        reseal_header(header)
        table = b"".join(_ENTRY.pack(k, dt, r, c, data_off + off, nb, crc, 0)
                         for k, dt, r, c, off, nb, crc in self._tensors)
        heads = b"".join((header, slots.tobytes(), b"\0" * (tensor_off - slot_off - 4 * n_slots),
                          table, b"\0" * (data_off - tensor_off - len(table))))
        in_place = self._tmp is not None
        tmp, f = self._tmp, self._blob
        try:
            if not in_place:
                fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                           dir=self._dir)
                f = os.fdopen(fd, "wb")
            f.seek(0)  # in place: the payloads already lie after the reserved tables
            f.write(heads)
            if not in_place:
                self._blob.seek(0)
                shutil.copyfileobj(self._blob, f, 1 << 20)
            f.flush()
            size = os.fstat(f.fileno()).st_size
            if size != file_size:  # pragma: no cover - a bug, not a user error
                raise RuntimeError(f"wrote {size} bytes, expected {file_size}")
            os.fsync(f.fileno())
            f.close()
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
            self._tmp = None  # moved into place: abort() must not remove it
        except BaseException:
            if f is not None:
                f.close()
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
            self._tmp = None
            self.abort()
            raise
        self.abort()  # releases the payload file and the memo
        self.info = {"path": str(self.path), "n_tensors": n_tensors, "n_slots": n_slots,
                     "file_size": file_size, "payload_bytes": sum(t[5] for t in self._tensors)}
        return self.info

    def abort(self) -> None:
        """Drop everything written so far; `path` is left as it was."""
        blob, self._blob = self._blob, None
        if blob is not None:
            blob.close()
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self._by_source.clear()
        self._keep_alive.clear()

    def __enter__(self) -> "ModelWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# ------------------------------------------------------------------ reading

def _parse_header(buf: bytes) -> dict[str, Any]:
    if len(buf) < HEADER_BYTES:
        raise ValueError(f"file is {len(buf)} bytes, shorter than the {HEADER_BYTES}-byte header")
    h = {name: struct.unpack_from(fmt, buf, off)[0] for name, (off, fmt) in HEADER_FIELDS.items()}
    h["slots_per_layer"] = slots_per_layer(h["n_experts"])
    h["header_crc_ok"] = zlib.crc32(bytes(buf[:HEADER_CRC_BYTES])) == h["header_crc32"]
    return h


def read_header(path) -> dict[str, Any]:
    """Header fields, plus "slots_per_layer", "header_crc_ok", "slots" (per layer, a list of
    tensor indices with ABSENT for none) and "tensors" (one dict per entry, with its
    "entry_offset"). Reads only the header and tables; checks only that they fit the file."""
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
        h = _parse_header(head)
        size = os.fstat(f.fileno()).st_size
        spl, nl, nt = h["slots_per_layer"], h["n_layers"], h["n_tensors"]
        slot_end = h["slot_table_offset"] + 4 * nl * spl
        tensor_end = h["tensor_table_offset"] + TENSOR_ENTRY_BYTES * nt
        if slot_end > size or tensor_end > size:
            raise ValueError(f"{path}: the tables end past the end of the file ({size} bytes)")
        f.seek(h["slot_table_offset"])
        flat = np.frombuffer(f.read(4 * nl * spl), dtype="<u4")
        h["slots"] = [flat[l * spl:(l + 1) * spl].tolist() for l in range(nl)]
        f.seek(h["tensor_table_offset"])
        raw = f.read(TENSOR_ENTRY_BYTES * nt)
    tensors = []
    for i in range(nt):
        vals = _ENTRY.unpack_from(raw, i * TENSOR_ENTRY_BYTES)
        t = dict(zip(TENSOR_FIELDS, vals))
        t["entry_offset"] = h["tensor_table_offset"] + i * TENSOR_ENTRY_BYTES
        tensors.append(t)
    h["tensors"] = tensors
    h["actual_size"] = size
    return h


def expert_payload_bytes(header: dict) -> int:
    """Bytes of the routed experts' payloads in a file (read_header's dict; a tensor that
    several slots share counted once): what a memory budget's expert cache takes turns
    over; the rest (routers, shared experts) stays resident."""
    E = header["n_experts"]
    idx = {t for slots in header["slots"] for t in slots[1:1 + 3 * E] if t != ABSENT}
    return sum(header["tensors"][t]["nbytes"] for t in idx)


def _decode(buf, t: dict) -> np.ndarray:
    rows, cols, off = t["rows"], t["cols"], t["offset"]
    n = rows * cols
    if t["dtype"] == 0:
        return np.frombuffer(buf, "<f4", n, off).reshape(rows, cols).astype(np.float32)
    if t["dtype"] == 1:
        return quant.from_bf16(np.frombuffer(buf, "<u2", n, off).reshape(rows, cols))
    if t["dtype"] == 4:
        rb = quant.int4k_row_bytes(cols)
        return quant.dequantize_int4k(np.frombuffer(buf, np.uint8, rows * rb, off).reshape(rows, rb), cols)
    if t["dtype"] == 3:
        ng = quant.int4_groups(cols)
        q = np.frombuffer(buf, np.uint8, rows * ng * 16, off).reshape(rows, ng * 16)
        s = np.frombuffer(buf, "<f4", rows * ng, off + rows * ng * 16).reshape(rows, ng)
        return quant.dequantize_int4(q, s.astype(np.float32), cols)
    q = np.frombuffer(buf, np.int8, n, off).reshape(rows, cols)
    s = np.frombuffer(buf, "<f4", rows, off + _align(n, 4)).astype(np.float32)
    return quant.dequantize_int8(q, s)


def read_layers(path) -> list[dict[str, Any]]:
    """The layers of a file as the engine computes with them: float32 (dequantized)
    arrays in save_model's layer-dict layout, plus the routing config. Checks CRCs."""
    h = read_header(path)
    buf = Path(path).read_bytes()
    for i, t in enumerate(h["tensors"]):
        if zlib.crc32(buf[t["offset"]:t["offset"] + t["nbytes"]]) != t["crc32"]:
            raise ValueError(f"{path}: tensor[{i}] fails its CRC-32 check")
    E, S = h["n_experts"], h["shared_inter"]
    cache: dict[int, np.ndarray] = {}

    def get(idx: int) -> np.ndarray:
        if idx not in cache:
            cache[idx] = _decode(buf, h["tensors"][idx])
        return cache[idx]

    out = []
    for slots in h["slots"]:
        d: dict[str, Any] = {
            "router": get(slots[0]),
            "gate": np.stack([get(slots[1 + 3 * e]) for e in range(E)]),
            "up": np.stack([get(slots[2 + 3 * e]) for e in range(E)]),
            "down": np.stack([get(slots[3 + 3 * e]) for e in range(E)]),
            "top_k": h["top_k"], "scoring": SCORING_NAMES.get(h["scoring"], h["scoring"]),
            "norm_topk_prob": bool(h["norm_topk_prob"]), "dyn_p": float(h["dyn_p"]),
            "k_min": h["k_min"], "k_max": h["k_max"],
        }
        if S:
            for k, name in enumerate(_SHARED_KEYS):
                d[name] = get(slots[1 + 3 * E + k])
            if h["shared_gated"]:
                d["shared_expert_gate"] = get(slots[4 + 3 * E])[0]
        out.append(d)
    return out
