"""Writing and reading Colibri model files (format v1, FORMAT.md).

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
VERSION = 1
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
DTYPE_NAMES = quant.DTYPES  # code -> name: ("f32", "bf16", "int8", "int4")

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
    if wdtype == 3:  # int4: packed groups (a multiple of 16 bytes per row), then the scales
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

    weight_dtype ("f32" | "bf16" | "int8" | "int4") applies to expert and shared-expert
    matrices; the router and the shared expert gate stay f32. With share=True,
    identical tensors (same kind and stored bytes, e.g. one expert array reused by
    several layers) are stored once and named by several slots.

    Returns {"path", "n_tensors", "n_slots", "file_size", "payload_bytes"}.
    """
    if weight_dtype not in quant.DTYPE_CODES:
        raise ValueError(f"weight_dtype must be one of {list(quant.DTYPE_CODES)}, got {weight_dtype!r}")
    wdt = quant.DTYPE_CODES[weight_dtype]
    alignment = _int_field("alignment", alignment, MIN_ALIGNMENT, MAX_ALIGNMENT)
    if alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    if isinstance(layers, dict) or not isinstance(layers, Sequence):
        raise TypeError("layers must be a list of layer dicts")
    if not 1 <= len(layers) <= MAX_LAYERS:
        raise ValueError(f"need 1 .. {MAX_LAYERS} layers, got {len(layers)}")

    checked = [_check_layer(i, d) for i, d in enumerate(layers)]
    cfg = checked[0][1]
    for i, (_, c) in enumerate(checked[1:], start=1):
        for k, v in cfg.items():
            if c[k] != v:
                raise ValueError(f"layers[{i}] has {k} = {c[k]}, but layers[0] has {v}: all layers "
                                 f"must share dimensions and routing config")
    E, S, gated = cfg["n_experts"], cfg["shared_inter"], cfg["shared_gated"]
    spl = slots_per_layer(E)
    n_slots = len(layers) * spl

    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    tensors: list[tuple[int, int, int, int, int, int, int]] = []  # kind dtype rows cols off nbytes crc
    slots = np.full(n_slots, ABSENT, dtype="<u4")
    by_hash: dict[tuple, int] = {}
    by_source: dict[tuple, int] = {}
    keep_alive = []  # objects whose id() is a memo key
    with tempfile.TemporaryFile(dir=directory) as blob:
        blob_end = 0

        def add(slot: int, kind: int, source, sub, mat: np.ndarray) -> None:
            nonlocal blob_end
            memo = (id(source), sub, kind)
            if share and memo in by_source:
                slots[slot] = by_source[memo]
                return
            dtype, data = _payload(kind, mat, wdt)
            key = (kind, dtype, mat.shape, hashlib.blake2b(data, digest_size=32).digest())
            if share and key in by_hash:
                t = by_hash[key]
            else:
                off = _align(blob_end, alignment)
                blob.seek(off)
                blob.write(data)
                blob_end = off + len(data)
                t = len(tensors)
                tensors.append((kind, dtype, mat.shape[0], mat.shape[1], off, len(data),
                                zlib.crc32(data)))
                by_hash[key] = t
            if share:
                by_source[memo] = t
                keep_alive.append(source)
            slots[slot] = t

        for l, (arr, _) in enumerate(checked):
            base = l * spl
            src = layers[l]
            add(base, KIND["router"], src["router"], None, arr["router"])
            for e in range(E):
                for k, name in enumerate(("gate", "up", "down")):
                    add(base + 1 + 3 * e + k, KIND[name], src[name], e, arr[name][e])
            if S:
                for k, name in enumerate(_SHARED_KEYS):
                    add(base + 1 + 3 * E + k, KIND[name], src[name], None, arr[name])
                if gated:
                    add(base + 4 + 3 * E, KIND["shared_expert_gate"], src["shared_expert_gate"],
                        None, arr["shared_expert_gate"])

        n_tensors = len(tensors)
        slot_off = HEADER_BYTES
        tensor_off = _align(slot_off + 4 * n_slots, 8)
        data_off = _align(tensor_off + TENSOR_ENTRY_BYTES * n_tensors, alignment)
        file_size = data_off + blob_end
        header = bytearray(_HEADER.pack(
            MAGIC, VERSION, HEADER_BYTES, len(layers), cfg["hidden"], cfg["inter"], E,
            cfg["top_k"], cfg["scoring"], cfg["norm_topk_prob"], cfg["dyn_p"], cfg["k_min"],
            cfg["k_max"], wdt, S, gated, alignment, n_tensors, slot_off, tensor_off, data_off,
            file_size, 0))
        reseal_header(header)
        table = b"".join(_ENTRY.pack(k, dt, r, c, data_off + off, nb, crc, 0)
                         for k, dt, r, c, off, nb, crc in tensors)

        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(slots.tobytes())
                f.write(b"\0" * (tensor_off - slot_off - 4 * n_slots))
                f.write(table)
                f.write(b"\0" * (data_off - tensor_off - len(table)))
                blob.seek(0)
                shutil.copyfileobj(blob, f, 1 << 20)
                f.flush()
                if f.tell() != file_size:  # pragma: no cover - a bug, not a user error
                    raise RuntimeError(f"wrote {f.tell()} bytes, expected {file_size}")
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
    return {"path": str(path), "n_tensors": n_tensors, "n_slots": n_slots, "file_size": file_size,
            "payload_bytes": sum(t[5] for t in tensors)}


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


def _decode(buf, t: dict) -> np.ndarray:
    rows, cols, off = t["rows"], t["cols"], t["offset"]
    n = rows * cols
    if t["dtype"] == 0:
        return np.frombuffer(buf, "<f4", n, off).reshape(rows, cols).astype(np.float32)
    if t["dtype"] == 1:
        return quant.from_bf16(np.frombuffer(buf, "<u2", n, off).reshape(rows, cols))
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
