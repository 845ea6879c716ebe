"""Model files (FORMAT.md): writer, loader, validation, dump tool, numerics.

Malformed files: each case corrupts one field of a valid file (re-sealing the
header CRC where the field is covered by it, so the specific check is reached)
and checks the loader's message names that field and its byte offset. The same
message comes out of colibri_dump_schema. Round trips compare Model(x) with the
float64 reference of the layer stack, h = h + moe(h), at 1e-4 relative.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri import _lib, quant, reference
from colibri.model import Model, ModelFormatError
from colibri.modelfile import (ABSENT, HEADER_FIELDS, TENSOR_FIELDS, field_offsets, patch,
                               patch_header, read_header, read_layers, reseal_header, save_model,
                               slot_index, slot_offset, tensor_field_offset)
from moe_data import MARGIN, assert_close, assert_engine, make_case

ROOT = Path(__file__).resolve().parents[2]
H, I, E, S = 64, 32, 4, 48
U64 = 2**64


# ------------------------------------------------------------------ helpers

def layer_dict(case) -> dict:
    d = dict(router=case.router, gate=case.gate, up=case.up, down=case.down)
    d.update(case.route)
    d.update(case.shared)
    return d


def stack_cases(n_layers, *, H=H, I=I, E=E, k=2, S=0, gated=False, seed=0, **route):
    return [make_case(H, I, E, k, S=S, gated=gated, seed=seed + 17 * l, **route)
            for l in range(n_layers)]


def engine_weights(d: dict, dtype: str) -> dict:
    """A layer dict with the weights as the engine holds them in `dtype` (router and the
    shared expert gate stay f32)."""
    out = dict(d)
    for k in ("gate", "up", "down", "shared_gate", "shared_up", "shared_down"):
        if d.get(k) is not None:
            out[k] = quant.roundtrip(d[k], dtype)
    return out


def _route_kw(d):
    return dict(top_k=d["top_k"], scoring=d.get("scoring", "softmax"),
                norm_topk_prob=d.get("norm_topk_prob", True), dyn_p=d.get("dyn_p", 0.0) or 0.0,
                k_min=d.get("k_min", 1), k_max=d.get("k_max"))


def reference_stack(x, layers, *, margins=False, dtype="f32"):
    """float64 h = h + moe(h) per layer; with margins=True also each token's smallest
    routing margin over the layers. dtype: the activation rounding of its kernels."""
    h = np.asarray(x, np.float64)
    worst = np.full(len(h), np.inf)
    for d in layers:
        kw = _route_kw(d)
        logits = h @ np.asarray(d["router"], np.float64).T
        worst = np.minimum(worst, reference.topk_margin(logits, kw["top_k"], kw["dyn_p"],
                                                        kw["k_min"], kw["k_max"]))
        shared = {k: d.get(k) for k in ("shared_gate", "shared_up", "shared_down",
                                        "shared_expert_gate")}
        h = h + reference.moe_layer(h, d["router"], d["gate"], d["up"], d["down"], **kw, **shared,
                                    act=quant.ACTIVATION_ROUNDING.get(dtype))
    return (h, worst) if margins else h


def stack_inputs(layers, T, seed=1):
    """x [T, H] float32 with no near-tie at the top-k cut at any layer (resampled)."""
    rng = np.random.default_rng(seed)
    hidden = layers[0]["router"].shape[1]
    x = rng.standard_normal((T, hidden), dtype=np.float32)
    for _ in range(200):
        _, m = reference_stack(x, layers, margins=True)
        bad = m < MARGIN
        if not bad.any():
            return x
        x[bad] = rng.standard_normal((int(bad.sum()), hidden), dtype=np.float32)
    raise RuntimeError("could not draw inputs with a clear routing margin")


def load_error(buf: bytes, tmp_path: Path, name="bad.colibri") -> str:
    """Write buf, load it, expect ModelFormatError; returns the engine's message."""
    p = tmp_path / name
    p.write_bytes(bytes(buf))
    with pytest.raises(ModelFormatError) as ei:
        Model.load(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ")
    return msg[len(f"{p}: "):]


@pytest.fixture(scope="session")
def dump_tool(lib):
    tool = Path(_lib.default_library_path()).resolve().parent / "colibri_dump_schema"
    assert tool.exists(), f"colibri_dump_schema is not built beside the library ({tool})"
    return tool


def run_dump(tool, path):
    return subprocess.run([str(tool), str(path)], capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------ the base file

@pytest.fixture(scope="module")
def base(tmp_path_factory, lib):
    """A valid 2-layer f32 file with every slot kind (gated shared expert)."""
    cases = stack_cases(2, S=S, gated=True, seed=3)
    layers = [layer_dict(c) for c in cases]
    path = tmp_path_factory.mktemp("base") / "base.colibri"
    save_model(path, layers)
    return dict(path=path, bytes=path.read_bytes(), header=read_header(path), layers=layers)


@pytest.fixture(scope="module")
def plain(tmp_path_factory, lib):
    """A valid 1-layer file without a shared expert (shared slots absent)."""
    path = tmp_path_factory.mktemp("plain") / "plain.colibri"
    save_model(path, [layer_dict(make_case(H, I, E, 2, seed=5))])
    return dict(path=path, bytes=path.read_bytes(), header=read_header(path))


def test_base_file_loads(base):
    h = base["header"]
    assert h["header_crc_ok"] and h["file_size"] == h["actual_size"] == len(base["bytes"])
    assert h["n_tensors"] == 2 * (1 + 3 * E + 4)
    with Model.load(base["path"]) as m:
        assert (m.n_layers, m.hidden) == (2, H)


def test_field_offsets_match_format_md():
    """The exported offsets are the ones FORMAT.md's tables give."""
    text = (ROOT / "FORMAT.md").read_text()
    offs = field_offsets()
    for name, off in offs["header"].items():
        assert f"| {off} | " in text and f"`{name}`" in text
    assert offs["header"]["header_crc32"] == 104 and offs["header"]["file_size"] == 96
    assert offs["tensor"] == {"kind": 0, "dtype": 4, "rows": 8, "cols": 16, "offset": 24,
                              "nbytes": 32, "crc32": 40, "reserved": 44}


# ------------------------------------------------------------------ malformed: header

def _hdr(field):
    return HEADER_FIELDS[field][0]


HEADER_CASES = {
    # id: (field, value, reseal, expected message fragment)
    "magic": ("magic", 0x12345678, True, "header.magic (byte 0): 0x12345678, expected 0xCAFE1234"),
    "version": ("version", 3, True, "header.version (byte 4): 3, expected 1 to 2"),
    "version-0": ("version", 0, True, "header.version (byte 4): 0, expected 1 to 2"),
    "header_bytes": ("header_bytes", 256, True, "header.header_bytes (byte 8): 256, expected 128"),
    "n_layers-0": ("n_layers", 0, True, "header.n_layers (byte 12): 0, expected 1 .. 65536"),
    "n_layers-big": ("n_layers", 65537, True, "header.n_layers (byte 12): 65537, expected 1 .. 65536"),
    "hidden-0": ("hidden", 0, True, "header.hidden (byte 16): 0, expected 1 .. 1048576"),
    "hidden-big": ("hidden", 2**20 + 1, True, "header.hidden (byte 16): 1048577, expected 1 .. 1048576"),
    "inter-0": ("inter", 0, True, "header.inter (byte 20): 0, expected 1 .. 1048576"),
    "n_experts-0": ("n_experts", 0, True, "header.n_experts (byte 24): 0, expected 1 .. 4096"),
    "n_experts-big": ("n_experts", 4097, True, "header.n_experts (byte 24): 4097, expected 1 .. 4096"),
    "top_k-0": ("top_k", 0, True, "header.top_k (byte 28): 0, expected 1 .. 4"),
    "top_k-gt-E": ("top_k", E + 1, True, f"header.top_k (byte 28): {E + 1}, expected 1 .. {E}"),
    "scoring": ("scoring", 2, True, "header.scoring (byte 32): 2, expected 0 .. 1"),
    "norm_topk_prob": ("norm_topk_prob", 7, True, "header.norm_topk_prob (byte 36): 7, expected 0 .. 1"),
    "dyn_p-gt-1": ("dyn_p", 1.5, True, "header.dyn_p (byte 40): 1.5, expected 0"),
    "dyn_p-neg": ("dyn_p", -0.25, True, "header.dyn_p (byte 40): -0.25, expected 0"),
    "dyn_p-nan": ("dyn_p", float("nan"), True, "header.dyn_p (byte 40): nan"),
    "k_min-fixed": ("k_min", 1, True, "header.k_min (byte 44): 1, expected 0 in fixed top-k mode"),
    "k_max-fixed": ("k_max", 2, True, "header.k_max (byte 48): 2, expected 0 in fixed top-k mode"),
    "weight_dtype": ("weight_dtype", 5, True, "header.weight_dtype (byte 52): 5, expected 0 .. 4"),
    "shared_inter-big": ("shared_inter", 2**20 + 1, True, "header.shared_inter (byte 56): 1048577"),
    "shared_gated-2": ("shared_gated", 2, True, "header.shared_gated (byte 60): 2, expected 0 .. 1"),
    "alignment-npot": ("alignment", 96, True, "header.alignment (byte 64): 96, expected a power of two"),
    "alignment-small": ("alignment", 32, True, "header.alignment (byte 64): 32, expected a power of two in 64 .. 2097152"),
    "alignment-big": ("alignment", 2**22, True, "header.alignment (byte 64): 4194304"),
    "n_tensors-0": ("n_tensors", 0, True, "header.n_tensors (byte 68): 0, expected 1 .. n_layers x slots_per_layer (2 x 17 = 34)"),
    "n_tensors-big": ("n_tensors", 35, True, "header.n_tensors (byte 68): 35, expected 1 .. n_layers x slots_per_layer (2 x 17 = 34)"),
    "slot_table-low": ("slot_table_offset", 64, True, "header.slot_table_offset (byte 72): 64, expected >= 128 and a multiple of 4"),
    "slot_table-misaligned": ("slot_table_offset", 130, True, "header.slot_table_offset (byte 72): 130, expected >= 128 and a multiple of 4"),
    "slot_table-overflow": ("slot_table_offset", U64 - 64, True, f"header.slot_table_offset (byte 72): offset {U64 - 64} + slot table 136 bytes overflows 64 bits"),
    "tensor_table-overlap": ("tensor_table_offset", 256, True, "header.tensor_table_offset (byte 80): 256, expected >= 264 (the end of the slot table) and a multiple of 8"),
    "tensor_table-misaligned": ("tensor_table_offset", 268, True, "header.tensor_table_offset (byte 80): 268, expected >= 264 (the end of the slot table) and a multiple of 8"),
    "tensor_table-overflow": ("tensor_table_offset", U64 - 8, True, f"header.tensor_table_offset (byte 80): offset {U64 - 8} + tensor table 1632 bytes overflows 64 bits"),
    "data_offset-overlap": ("data_offset", 1856, True, "header.data_offset (byte 88): 1856, expected >= 1896 (the end of the tensor table) and a multiple of header.alignment (64)"),
    "data_offset-misaligned": ("data_offset", 1920 + 8, True, "header.data_offset (byte 88): 1928, expected >= 1896"),
    "file_size-big": ("file_size", None, True, "header.file_size (byte 96): {fs1}, but the file is {fs} bytes"),
    "file_size-small": ("file_size", None, True, "header.file_size (byte 96): {fsm}, but the file is {fs} bytes"),
    "header-crc": ("n_layers", 3, False, "header.header_crc32 (byte 104): stored 0x"),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_header_field_rejected(base, tmp_path, case):
    field, value, reseal, want = HEADER_CASES[case]
    h = base["header"]
    assert h["slot_table_offset"] == 128 and h["tensor_table_offset"] == 264
    assert h["data_offset"] == 1920  # the offsets the expected messages quote
    fs = h["file_size"]
    if case == "file_size-big":
        value = fs + 1
    elif case == "file_size-small":
        value = fs - 64
    buf = bytearray(base["bytes"])
    patch_header(buf, field, value, reseal=reseal)
    msg = load_error(buf, tmp_path)
    assert want.format(fs=fs, fs1=fs + 1, fsm=fs - 64) in msg, msg


def test_header_crc_message_quotes_both_values(base, tmp_path):
    buf = bytearray(base["bytes"])
    stored = struct.unpack_from("<I", buf, 104)[0]
    patch_header(buf, "hidden", 65, reseal=False)
    actual = zlib.crc32(bytes(buf[:104]))
    msg = load_error(buf, tmp_path)
    assert msg == (f"header.header_crc32 (byte 104): stored 0x{stored:08X}, but the CRC-32 of "
                   f"bytes 0 .. 103 is 0x{actual:08X} (the header is corrupt)")


@pytest.mark.parametrize("byte", [108, 115, 127])
def test_header_reserved_not_zero(base, tmp_path, byte):
    buf = bytearray(base["bytes"])
    buf[byte] = 0x5A  # reserved bytes are outside the header CRC
    assert f"header.reserved (byte {byte}): 0x5A, expected zero" in load_error(buf, tmp_path)


def test_shared_gated_without_shared_expert(base, tmp_path):
    buf = bytearray(base["bytes"])
    patch_header(buf, "shared_inter", 0)
    msg = load_error(buf, tmp_path)
    assert msg.startswith("header.shared_gated (byte 60): 1, but there is no shared expert"), msg


@pytest.mark.parametrize("fields, want", [
    ({"dyn_p": 0.5, "k_min": 0, "k_max": 2}, "header.k_min (byte 44): 0, expected 1 .. k_max (2) in dynamic mode"),
    ({"dyn_p": 0.5, "k_min": 3, "k_max": 2}, "header.k_min (byte 44): 3, expected 1 .. k_max (2) in dynamic mode"),
    ({"dyn_p": 0.5, "k_min": 1, "k_max": E + 1}, f"header.k_max (byte 48): {E + 1}, expected k_min (1) .. n_experts ({E}) in dynamic mode"),
])
def test_dynamic_routing_fields(base, tmp_path, fields, want):
    buf = bytearray(base["bytes"])
    for k, v in fields.items():
        patch_header(buf, k, v)
    assert want in load_error(buf, tmp_path)


def test_layers_times_slots_use_64_bit_sizes(base, tmp_path):
    """65536 layers x 12293 slots x 4 bytes is past 2^31: a 32-bit int size would wrap."""
    buf = bytearray(base["bytes"])
    patch_header(buf, "n_experts", 4096)
    patch_header(buf, "n_layers", 65536)
    spl = 1 + 3 * 4096 + 4
    nbytes = 65536 * spl * 4
    assert nbytes > 2**31
    patch_header(buf, "tensor_table_offset", 128 + nbytes)
    patch_header(buf, "data_offset", 128 + nbytes + 34 * 48 + (-(128 + nbytes + 34 * 48) % 64))
    msg = load_error(buf, tmp_path)
    assert msg.startswith(f"slot table (byte 128): 65536 layers x {spl} slots x 4 = {nbytes} bytes "
                          f"end at byte {128 + nbytes}, past the end of the file "
                          f"({len(buf)} bytes)"), msg


def test_data_offset_past_end(base, tmp_path):
    buf = bytearray(base["bytes"])
    far = (len(buf) + 4096) // 64 * 64
    patch_header(buf, "data_offset", far)
    assert (f"header.data_offset (byte 88): {far} is past the end of the file ({len(buf)} bytes)"
            in load_error(buf, tmp_path))


def test_empty_file_and_not_a_model(tmp_path, lib):
    assert load_error(b"", tmp_path).startswith(
        "header (byte 0): the file is 0 bytes, shorter than the 128-byte header")
    junk = bytes(range(256)) * 4
    assert load_error(junk, tmp_path).startswith("header.magic (byte 0): 0x03020100")


def test_appended_bytes_are_a_size_mismatch(base, tmp_path):
    buf = bytes(base["bytes"]) + b"\0" * 10
    n = len(base["bytes"])
    assert load_error(buf, tmp_path) == (
        f"header.file_size (byte 96): {n}, but the file is {n + 10} bytes")


# ------------------------------------------------------------------ malformed: truncation

def expected_truncation(h: dict, cut: int) -> str:
    """The start of the message for the file cut to `cut` bytes: the structure that is cut."""
    spl, nl, nt = h["slots_per_layer"], h["n_layers"], h["n_tensors"]
    slot_end = h["slot_table_offset"] + 4 * nl * spl
    tensor_end = h["tensor_table_offset"] + 48 * nt
    if cut < 128:
        return f"header (byte 0): the file is {cut} bytes, shorter than the 128-byte header"
    if cut < slot_end:
        return (f"slot table (byte {h['slot_table_offset']}): {nl} layers x {spl} slots x 4 = "
                f"{4 * nl * spl} bytes end at byte {slot_end}, past the end of the file ({cut} bytes)"
                f"; the file is truncated (header.file_size says {h['file_size']} bytes)")
    if cut < tensor_end:
        return (f"tensor table (byte {h['tensor_table_offset']}): {nt} entries x 48 = {48 * nt} bytes "
                f"end at byte {tensor_end}, past the end of the file ({cut} bytes)"
                f"; the file is truncated (header.file_size says {h['file_size']} bytes)")
    if cut < h["data_offset"]:
        return (f"header.data_offset (byte 88): {h['data_offset']} is past the end of the file "
                f"({cut} bytes); the file is truncated")
    for i, t in enumerate(h["tensors"]):
        end = t["offset"] + t["nbytes"]
        if end > cut:
            return (f"tensor[{i}].offset (byte {t['entry_offset'] + 24}): offset {t['offset']} + "
                    f"nbytes {t['nbytes']} = {end} is past the end of the file ({cut} bytes)"
                    f"; the file is truncated (header.file_size says {h['file_size']} bytes)")
    raise AssertionError("cut is not inside the file")


def truncation_points(h: dict) -> list[int]:
    slot_end = h["slot_table_offset"] + 4 * h["n_layers"] * h["slots_per_layer"]
    tensor_end = h["tensor_table_offset"] + 48 * h["n_tensors"]
    pts = {0, 1, 4, 64, 103, 104, 127, 128, 129, 131, 200, slot_end - 1, slot_end,
           h["tensor_table_offset"] + 1, tensor_end - 48, tensor_end - 1, tensor_end,
           h["data_offset"] - 1, h["data_offset"], h["file_size"] - 1}
    for t in h["tensors"][::3]:
        pts |= {t["offset"], t["offset"] + 1, t["offset"] + t["nbytes"] // 2,
                t["offset"] + t["nbytes"] - 1}
    return sorted(p for p in pts if 0 <= p < h["file_size"])


def test_truncated_anywhere(base, tmp_path):
    h = base["header"]
    pts = truncation_points(h)
    assert len(pts) > 40
    seen = set()
    for cut in pts:
        msg = load_error(base["bytes"][:cut], tmp_path)
        want = expected_truncation(h, cut)
        assert msg.startswith(want), f"cut at {cut}: {msg!r}, expected {want!r}"
        seen.add(msg.split(" ")[0])
    # every region of the file was cut somewhere
    assert {"header", "slot", "tensor", "header.data_offset"} <= seen
    assert any(s.startswith("tensor[") for s in seen)


# ------------------------------------------------------------------ malformed: tensor entries

def _tf(h, i, field):
    return tensor_field_offset(h, i, field)


def test_tensor_kind_out_of_range(base, tmp_path):
    h = base["header"]
    buf = bytearray(base["bytes"])
    patch(buf, _tf(h, 3, "kind"), "<I", 9)
    assert load_error(buf, tmp_path) == f"tensor[3].kind (byte {_tf(h, 3, 'kind')}): 9, expected 0 .. 7"


@pytest.mark.parametrize("index, dtype, want", [
    (1, 1, "1 (bf16), expected 0 (f32) for kind 1 (gate)"),
    (0, 2, "2 (int8), expected 0 (f32) for kind 0 (router)"),
    (3, 7, "7 (unknown), expected 0 (f32) for kind 3 (down)"),
])
def test_tensor_dtype_mismatch(base, tmp_path, index, dtype, want):
    h = base["header"]
    buf = bytearray(base["bytes"])
    patch(buf, _tf(h, index, "dtype"), "<I", dtype)
    assert load_error(buf, tmp_path) == f"tensor[{index}].dtype (byte {_tf(h, index, 'dtype')}): {want}"


@pytest.mark.parametrize("rows, cols", [(2**33, 2**33), (2**62, 1), (2**61 + 1, 2)])
def test_tensor_size_overflow(base, tmp_path, rows, cols):
    """rows x cols, or rows x cols x 4 bytes (f32), past 2^64 is an overflow, not a wrap."""
    h = base["header"]
    buf = bytearray(base["bytes"])
    patch(buf, _tf(h, 2, "rows"), "<Q", rows)
    patch(buf, _tf(h, 2, "cols"), "<Q", cols)
    assert load_error(buf, tmp_path) == (
        f"tensor[2].rows (byte {_tf(h, 2, 'rows')}): rows {rows} x cols {cols} of f32: the payload "
        f"size overflows 64 bits")


@pytest.mark.parametrize("index, field, value, want", [
    (1, "rows", I + 1, f"{I + 1}, expected {I} (inter) for kind 1 (gate)"),
    (1, "cols", H - 1, f"{H - 1}, expected {H} (hidden) for kind 1 (gate)"),
    (0, "rows", 0, f"0, expected {E} (n_experts) for kind 0 (router)"),
    (3, "rows", I, f"{I}, expected {H} (hidden) for kind 3 (down)"),
    (13, "rows", S + 1, f"{S + 1}, expected {S} (shared_inter) for kind 4 (shared gate)"),
    (15, "cols", H, f"{H}, expected {S} (shared_inter) for kind 6 (shared down)"),
    (16, "rows", 2, "2, expected 1 (one row) for kind 7 (shared expert gate)"),
])
def test_tensor_shape_mismatch(base, tmp_path, index, field, value, want):
    h = base["header"]
    assert [t["kind"] for t in h["tensors"][:17]] == [0] + [1, 2, 3] * E + [4, 5, 6, 7]
    buf = bytearray(base["bytes"])
    patch(buf, _tf(h, index, field), "<Q", value)
    assert load_error(buf, tmp_path) == f"tensor[{index}].{field} (byte {_tf(h, index, field)}): {want}"


def test_tensor_nbytes_mismatch(base, tmp_path):
    h = base["header"]
    buf = bytearray(base["bytes"])
    nb = h["tensors"][4]["nbytes"]
    patch(buf, _tf(h, 4, "nbytes"), "<Q", nb + 4)
    assert load_error(buf, tmp_path) == (
        f"tensor[4].nbytes (byte {_tf(h, 4, 'nbytes')}): {nb + 4}, expected {nb} for {I} x {H} f32")


def test_tensor_offset_misaligned(base, tmp_path):
    h = base["header"]
    buf = bytearray(base["bytes"])
    off = h["tensors"][5]["offset"] + 4
    patch(buf, _tf(h, 5, "offset"), "<Q", off)
    assert load_error(buf, tmp_path) == (
        f"tensor[5].offset (byte {_tf(h, 5, 'offset')}): {off} is not a multiple of "
        f"header.alignment (64)")


def test_tensor_offset_before_data(base, tmp_path):
    h = base["header"]
    buf = bytearray(base["bytes"])
    off = h["data_offset"] - 64
    patch(buf, _tf(h, 5, "offset"), "<Q", off)
    assert load_error(buf, tmp_path) == (
        f"tensor[5].offset (byte {_tf(h, 5, 'offset')}): {off} is before header.data_offset "
        f"({h['data_offset']})")


def test_tensor_offset_past_end(base, tmp_path):
    h = base["header"]
    buf = bytearray(base["bytes"])
    off = (len(buf) + 63) // 64 * 64
    nb = h["tensors"][6]["nbytes"]
    patch(buf, _tf(h, 6, "offset"), "<Q", off)
    assert load_error(buf, tmp_path) == (
        f"tensor[6].offset (byte {_tf(h, 6, 'offset')}): offset {off} + nbytes {nb} = {off + nb} "
        f"is past the end of the file ({len(buf)} bytes)")


def test_tensor_offset_plus_nbytes_overflows(base, tmp_path):
    h = base["header"]
    buf = bytearray(base["bytes"])
    off = U64 - 64
    nb = h["tensors"][6]["nbytes"]
    patch(buf, _tf(h, 6, "offset"), "<Q", off)
    assert load_error(buf, tmp_path) == (
        f"tensor[6].offset (byte {_tf(h, 6, 'offset')}): offset {off} + nbytes {nb} overflows 64 bits")


def test_tensor_reserved_not_zero(base, tmp_path):
    h = base["header"]
    buf = bytearray(base["bytes"])
    patch(buf, _tf(h, 7, "reserved"), "<I", 1)
    assert load_error(buf, tmp_path) == (
        f"tensor[7].reserved (byte {_tf(h, 7, 'reserved')}): 0x00000001, expected zero")


def test_shared_kind_without_shared_expert(plain, tmp_path):
    h = plain["header"]
    buf = bytearray(plain["bytes"])
    patch(buf, _tf(h, 1, "kind"), "<I", 4)
    assert load_error(buf, tmp_path) == (
        f"tensor[1].kind (byte {_tf(h, 1, 'kind')}): 4 (shared gate), but the header has no shared "
        f"expert (header.shared_inter 0)")


# ------------------------------------------------------------------ malformed: slots

def _slot(h, layer, name, expert=None):
    return slot_offset(h, layer, slot_index(h["n_experts"], name, expert))


def test_slot_names_wrong_kind(base, tmp_path):
    """gate and up have the same shape: only the slot check sees the swap."""
    h = base["header"]
    buf = bytearray(base["bytes"])
    patch(buf, _tf(h, 1, "kind"), "<I", 2)
    assert load_error(buf, tmp_path) == (
        f"slot[layer 0, expert 0 gate] (byte {_slot(h, 0, 'gate', 0)}): tensor 1 has kind 2 (up), "
        f"expected kind 1 (gate)")


def test_slot_points_at_other_kind(base, tmp_path):
    h = base["header"]
    buf = bytearray(base["bytes"])
    off = _slot(h, 1, "down", 2)
    patch(buf, off, "<I", 0)  # the router tensor
    assert load_error(buf, tmp_path) == (
        f"slot[layer 1, expert 2 down] (byte {off}): tensor 0 has kind 0 (router), expected kind 3 (down)")


@pytest.mark.parametrize("index", [34, 35, 1000, ABSENT - 1])
def test_slot_index_past_n_tensors(base, tmp_path, index):
    h = base["header"]
    buf = bytearray(base["bytes"])
    off = _slot(h, 1, "up", 3)
    patch(buf, off, "<I", index)
    assert load_error(buf, tmp_path) == (
        f"slot[layer 1, expert 3 up] (byte {off}): tensor index {index} is past the tensor table "
        f"(n_tensors 34)")


@pytest.mark.parametrize("layer, name, expert, why", [
    (0, "router", None, "this slot is always required"),
    (1, "gate", 0, "this slot is always required"),
    (1, "down", 3, "this slot is always required"),
    (0, "shared_up", None, "it is required when header.shared_inter > 0"),
    (1, "shared_expert_gate", None, "it is required when header.shared_gated is 1"),
])
def test_slot_absent_where_required(base, tmp_path, layer, name, expert, why):
    h = base["header"]
    buf = bytearray(base["bytes"])
    off = _slot(h, layer, name, expert)
    patch(buf, off, "<I", ABSENT)
    label = {"shared_up": "shared up", "shared_expert_gate": "shared expert gate"}.get(name, name)
    if expert is not None:
        label = f"expert {expert} {name}"
    assert load_error(buf, tmp_path) == (
        f"slot[layer {layer}, {label}] (byte {off}): absent (0xFFFFFFFF), but {why}")


def test_slot_present_where_it_must_be_absent(plain, tmp_path):
    h = plain["header"]
    buf = bytearray(plain["bytes"])
    off = _slot(h, 0, "shared_gate")
    patch(buf, off, "<I", 1)
    assert load_error(buf, tmp_path) == (
        f"slot[layer 0, shared gate] (byte {off}): names tensor 1, but must be absent (0xFFFFFFFF) "
        f"because there is no shared expert (header.shared_inter 0)")


# ------------------------------------------------------------------ malformed: checksums

@pytest.mark.parametrize("index", [0, 5, 14, 33])
def test_payload_checksum(base, tmp_path, index):
    h = base["header"]
    t = h["tensors"][index]
    buf = bytearray(base["bytes"])
    pos = t["offset"] + t["nbytes"] // 3
    buf[pos] ^= 0x01
    actual = zlib.crc32(bytes(buf[t["offset"]:t["offset"] + t["nbytes"]]))
    kind = ["router", "gate", "up", "down", "shared gate", "shared up", "shared down",
            "shared expert gate"][t["kind"]]
    assert load_error(buf, tmp_path) == (
        f"tensor[{index}].crc32 (byte {_tf(h, index, 'crc32')}): stored 0x{t['crc32']:08X}, but the "
        f"{kind} payload at bytes {t['offset']} .. {t['offset'] + t['nbytes'] - 1} has CRC-32 "
        f"0x{actual:08X} (the payload is corrupt)")


def test_stored_checksum_wrong(base, tmp_path):
    h = base["header"]
    buf = bytearray(base["bytes"])
    patch(buf, _tf(h, 9, "crc32"), "<I", h["tensors"][9]["crc32"] ^ 0x80000000)
    assert load_error(buf, tmp_path).startswith(f"tensor[9].crc32 (byte {_tf(h, 9, 'crc32')}): stored")


def test_first_bad_checksum_in_table_order(base, tmp_path):
    """Tensors are verified in parallel; the message still names the first bad one."""
    h = base["header"]
    buf = bytearray(base["bytes"])
    for i in (30, 8, 21):
        buf[h["tensors"][i]["offset"]] ^= 0xFF
    assert load_error(buf, tmp_path).startswith("tensor[8].crc32")


def test_a_load_without_the_crc_pass_takes_a_corrupt_payload_but_not_a_bad_header(base, tmp_path):
    # check_crc=False (the tuner's timing workers, which check outputs themselves) skips
    # only the pass over the payloads
    t = base["header"]["tensors"][5]
    buf = bytearray(base["bytes"])
    buf[t["offset"] + t["nbytes"] // 3] ^= 0x01
    p = tmp_path / "payload.colibri"
    p.write_bytes(bytes(buf))
    with pytest.raises(ModelFormatError, match=r"tensor\[5\]\.crc32"):
        Model.load(p)
    with Model.load(p, check_crc=False) as m:
        assert m.n_layers == 2
    buf = bytearray(base["bytes"])
    buf[20] ^= 0x01  # inside the header's checksummed bytes
    p.write_bytes(bytes(buf))
    with pytest.raises(ModelFormatError, match=r"^.*header"):
        Model.load(p, check_crc=False)


# ------------------------------------------------------------------ dump tool

def test_dump_valid_file(base, dump_tool):
    r = run_dump(dump_tool, base["path"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    h = base["header"]
    for field in HEADER_FIELDS:
        assert f"  {field} " in out, field
    assert "0xCAFE1234" in out and f"n_tensors            {h['n_tensors']}" in out
    assert "slot table (byte 128): 2 layers x 17 slots" in out
    assert "tensor table (byte 264): 34 entries x 48 bytes" in out
    for i, t in enumerate(h["tensors"]):
        row = next(l for l in out.splitlines() if l.lstrip().startswith(f"{i} "))
        assert f"{t['rows']} x {t['cols']}" in row and str(t["offset"]) in row
        assert f"0x{t['crc32']:08X} ok" in row
    assert "L1.shared.expert_gate" in out and "L0.e3.down" in out
    assert "checksums: all 34 tensors ok" in out
    assert r.stderr == ""


@pytest.mark.parametrize("corrupt", ["magic", "truncate", "slot"])
def test_dump_broken_file_prints_the_loader_message(base, tmp_path, dump_tool, corrupt):
    h = base["header"]
    buf = bytearray(base["bytes"])
    if corrupt == "magic":
        patch_header(buf, "magic", 0xDEADBEEF)
    elif corrupt == "truncate":
        buf = buf[:h["tensors"][20]["offset"] + 10]
    else:
        patch(buf, _slot(h, 0, "up", 1), "<I", 99)
    msg = load_error(buf, tmp_path)
    r = run_dump(dump_tool, tmp_path / "bad.colibri")
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.strip() == f"colibri_dump_schema: {tmp_path / 'bad.colibri'}: {msg}"


def test_dump_names_tensors_failing_their_checksum(base, tmp_path, dump_tool):
    h = base["header"]
    buf = bytearray(base["bytes"])
    for i in (2, 17):
        buf[h["tensors"][i]["offset"] + 5] ^= 0x10
    p = tmp_path / "crc.colibri"
    p.write_bytes(bytes(buf))
    r = run_dump(dump_tool, p)
    assert r.returncode == 1
    assert "tensor table (byte 264)" in r.stdout  # still printed
    bad_rows = [l for l in r.stdout.splitlines() if " BAD " in l]
    assert [int(l.split()[0]) for l in bad_rows] == [2, 17]
    assert "checksums: 2 of 34 tensors FAILED" in r.stdout
    assert "2 tensor(s) failed their CRC-32 check" in r.stderr
    assert f"tensor[2].crc32 (byte {_tf(h, 2, 'crc32')})" in r.stderr
    assert f"tensor[17].crc32 (byte {_tf(h, 17, 'crc32')})" in r.stderr


def test_dump_usage(dump_tool, tmp_path):
    assert subprocess.run([str(dump_tool)], capture_output=True).returncode == 2
    assert subprocess.run([str(dump_tool), "a", "b"], capture_output=True).returncode == 2
    r = subprocess.run([str(dump_tool), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "usage: colibri_dump_schema FILE" in r.stdout
    r = run_dump(dump_tool, tmp_path / "missing.colibri")
    assert r.returncode == 1 and "cannot open" in r.stderr


def _python_m(args, env=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [e.get("PYTHONPATH")] if p])
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True, text=True,
                          cwd=ROOT, env=e, timeout=300)


def test_python_m_dump_schema(base, dump_tool):
    r = _python_m(["dump-schema", str(base["path"])])
    assert r.returncode == 0, r.stderr
    assert r.stdout == run_dump(dump_tool, base["path"]).stdout
    r = _python_m(["dump-schema", "--help"])
    assert r.returncode == 0 and "FILE" in r.stdout.upper() and "Exit status" in r.stdout
    assert _python_m([]).returncode == 2


def test_python_m_dump_schema_broken_file(base, tmp_path, dump_tool):
    p = tmp_path / "bad.colibri"
    p.write_bytes(base["bytes"][:100])
    r = _python_m(["dump-schema", str(p)])
    assert r.returncode == 1
    assert "header (byte 0): the file is 100 bytes" in r.stderr


def test_python_m_dump_schema_without_the_tool(base, tmp_path, lib):
    """A library without the tool beside it: a clear error, not a traceback."""
    src = Path(_lib.default_library_path()).resolve()
    shutil.copy(src, tmp_path / "libcolibri.so")
    r = _python_m(["dump-schema", str(base["path"])], env={"COLIBRI_LIB": str(tmp_path / "libcolibri.so")})
    assert r.returncode == 3
    assert "colibri_dump_schema is not built" in r.stderr and str(tmp_path) in r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("dtype", ["int4g32", "int4"])
def test_int4_file_matches_the_int4_layer(tmp_path, lib, dtype):
    """An int4g32 (int4) model file holds exactly the bytes MoELayer(weight_dtype=dtype)
    computes with: the file's weights dequantize to quant.roundtrip, and one layer loaded
    from the file gives bitwise the layer's output plus the residual. int4's 300-wide rows
    end in a partial super-block."""
    (c,) = stack_cases(1, H=300, I=40, E=6, k=2, seed=12, S=S, gated=True)
    d = layer_dict(c)
    p = tmp_path / "m4.colibri"
    save_model(p, [d], weight_dtype=dtype)
    (back,) = read_layers(p)
    for k in ("gate", "up", "down", "shared_gate", "shared_up", "shared_down"):
        np.testing.assert_array_equal(back[k], quant.roundtrip(d[k], dtype))
    x = c.inputs(9)
    layer = colibri.MoELayer(weight_dtype=dtype, **{k: v for k, v in d.items()
                                                    if k not in ("k_min", "k_max", "dyn_p")})
    with Model.load(p) as m:
        np.testing.assert_array_equal(m(x), x + layer(x))


def test_a_file_written_in_format_v1_gives_its_old_outputs(lib):
    """tests/fixtures/model_v1/: an int4g32 seed file as the v1 writer wrote it (commit
    143d4c3, fuzz/make_seeds.py's shared_gated_int4), loaded by this engine: the same
    output as an int4g32 layer of the same weights, bitwise."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fuzz"))
    import make_seeds

    p = Path(__file__).resolve().parents[1] / "fixtures" / "model_v1" / "shared_gated_int4.colibri"
    assert read_header(p)["version"] == 1
    d = make_seeds.layer(2, shared=True, gated=True)
    layer = colibri.MoELayer(weight_dtype="int4g32", **d)
    x = np.random.default_rng(3).standard_normal((6, make_seeds.H)).astype(np.float32)
    with Model.load(p) as m:
        np.testing.assert_array_equal(m(x), x + layer(x))


def test_format_v1_int4_still_loads_and_v1_has_no_int4k(tmp_path, lib):
    """A v1 file (the format before int4: the same bytes, version 1) loads and computes
    as before; int4 (weight dtype 4) is refused in a v1 header."""
    (c,) = stack_cases(1, H=72, I=40, E=6, k=2, seed=13)
    d = layer_dict(c)
    x = c.inputs(5)
    for dtype in ("int4g32", "int4"):
        p = tmp_path / f"{dtype}.colibri"
        save_model(p, [d], weight_dtype=dtype)
        assert read_header(p)["version"] == 2
        with Model.load(p) as m:
            want = m(x)
        buf = bytearray(p.read_bytes())
        patch_header(buf, "version", 1)
        p.write_bytes(bytes(buf))
        if dtype == "int4g32":
            with Model.load(p) as m:
                np.testing.assert_array_equal(m(x), want)
        else:
            with pytest.raises(ModelFormatError, match=r"header.weight_dtype \(byte 52\): 4, expected 0 .. 3"):
                Model.load(p)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8", "int4"])
@pytest.mark.parametrize("variant", ["gated-shared", "plain"])
def test_round_trip(tmp_path, lib, dtype, variant):
    kw = dict(S=S, gated=True) if variant == "gated-shared" else {}
    layers = [layer_dict(c) for c in stack_cases(3, H=72, I=40, E=6, k=2, seed=11, **kw)]
    p = tmp_path / "m.colibri"
    save_model(p, layers, weight_dtype=dtype)
    held = [engine_weights(d, dtype) for d in layers]
    x = stack_inputs(held, 17)
    ref = reference_stack(x, held, dtype=dtype)
    with Model.load(p) as m:
        assert (m.n_layers, m.hidden) == (3, 72)
        for T in (1, 5, 17):
            assert_engine(m(x[:T]), ref[:T], dtype)
    # the Python reader sees the same weights as the engine
    for got, want in zip(read_layers(p), held):
        for k in ("router", "gate", "up", "down", "shared_gate", "shared_up", "shared_down",
                  "shared_expert_gate"):
            if want.get(k) is None:
                assert k not in got
            else:
                np.testing.assert_array_equal(got[k], np.asarray(want[k], np.float32))


@pytest.mark.parametrize("route", [
    dict(scoring="softmax_topk", norm=False),
    dict(scoring="softmax", norm=False),
    dict(scoring="softmax", norm=True, dyn_p=0.6, k_min=1, k_max=3),
])
def test_round_trip_routing_configs(tmp_path, lib, route):
    layers = [layer_dict(c) for c in stack_cases(2, H=65, I=33, E=8, k=3, S=24, seed=21, **route)]
    p = tmp_path / "r.colibri"
    save_model(p, layers)
    h = read_header(p)
    assert h["dyn_p"] == np.float32(route.get("dyn_p", 0.0))
    assert (h["k_min"], h["k_max"]) == ((route["k_min"], route["k_max"]) if "dyn_p" in route else (0, 0))
    x = stack_inputs(layers, 9)
    with Model.load(p) as m:
        assert_close(m(x), reference_stack(x, layers))


def test_round_trip_large_alignment_and_odd_shapes(tmp_path, lib):
    layers = [layer_dict(c) for c in stack_cases(2, H=130, I=96, E=16, k=4, seed=31)]
    p = tmp_path / "a.colibri"
    save_model(p, layers, weight_dtype="int8", alignment=4096)
    h = read_header(p)
    assert h["alignment"] == 4096 and h["data_offset"] % 4096 == 0
    assert all(t["offset"] % 4096 == 0 for t in h["tensors"])
    held = [engine_weights(d, "int8") for d in layers]
    x = stack_inputs(held, 7)
    with Model.load(p) as m:
        assert_engine(m(x), reference_stack(x, held, dtype="int8"), "int8")


def test_cross_layer_sharing(tmp_path, lib, dump_tool):
    """Layer 1 reuses layer 0's expert arrays (own router): stored once, named by both."""
    c0, c1 = stack_cases(2, seed=41)
    l0 = layer_dict(c0)
    l1 = dict(l0, router=c1.router)
    shared_p, unshared_p = tmp_path / "shared.colibri", tmp_path / "unshared.colibri"
    info = save_model(shared_p, [l0, l1])
    info_u = save_model(unshared_p, [l0, l1], share=False)
    assert info["n_tensors"] == 2 + 3 * E and info_u["n_tensors"] == 2 * (1 + 3 * E)
    assert shared_p.stat().st_size < unshared_p.stat().st_size
    assert info["payload_bytes"] < 0.6 * info_u["payload_bytes"]
    h = read_header(shared_p)
    assert h["slots"][0][1:1 + 3 * E] == h["slots"][1][1:1 + 3 * E]
    assert h["slots"][0][0] != h["slots"][1][0]
    r = run_dump(dump_tool, shared_p)
    assert r.returncode == 0, r.stderr
    row = next(l for l in r.stdout.splitlines() if l.lstrip().startswith("1 "))
    assert "L0.e0.gate L1.e0.gate" in row
    assert "sharing saves" in r.stdout
    x = stack_inputs([l0, l1], 11)
    ref = reference_stack(x, [l0, l1])
    with Model.load(shared_p) as a, Model.load(unshared_p) as b:
        ya, yb = a(x), b(x)
        assert_close(ya, ref)
        np.testing.assert_array_equal(ya, yb)
        # each layer still streams its full set of weights
        assert a.layer_weight_bytes(0) == a.layer_weight_bytes(1) == b.layer_weight_bytes(1)


def test_dedupe_by_content_not_identity(tmp_path, lib):
    """Equal bytes from different array objects are stored once too (share=True)."""
    c = make_case(H, I, E, 2, seed=51)
    d0 = layer_dict(c)
    d1 = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in d0.items()}
    p = tmp_path / "d.colibri"
    assert save_model(p, [d0, d1])["n_tensors"] == 1 + 3 * E
    assert save_model(p, [d0, d1], weight_dtype="bf16")["n_tensors"] == 1 + 3 * E
    h = read_header(p)
    assert h["slots"][0] == h["slots"][1]


def test_corrupt_shared_tensor_named_once(tmp_path, lib):
    c0, c1 = stack_cases(2, seed=61)
    l0 = layer_dict(c0)
    p = tmp_path / "s.colibri"
    save_model(p, [l0, dict(l0, router=c1.router)])
    h = read_header(p)
    t = h["slots"][1][slot_index(E, "up", 2)]
    buf = bytearray(p.read_bytes())
    buf[h["tensors"][t]["offset"] + 7] ^= 0x04
    assert load_error(buf, tmp_path).startswith(f"tensor[{t}].crc32")


# ------------------------------------------------------------------ binding behaviour

def test_model_call_validates_arguments(base):
    with Model.load(base["path"]) as m:
        x = np.zeros((3, H), np.float32)
        with pytest.raises(TypeError):
            m(x.astype(np.float64))
        with pytest.raises(TypeError):
            m(x.tolist())
        with pytest.raises(ValueError):
            m(np.zeros((3, H + 1), np.float32))
        with pytest.raises(ValueError):
            m(np.zeros(H, np.float32))
        with pytest.raises(ValueError):
            m(np.zeros((H, 6), np.float32).T)  # not C-contiguous
        with pytest.raises(ValueError):
            m(x, out=np.zeros((2, H), np.float32))
        assert m(np.zeros((0, H), np.float32)).shape == (0, H)
    with pytest.raises(ValueError, match="closed"):
        m(x)
    m.close()  # idempotent


def test_model_in_place_and_repeatable(base):
    x = stack_inputs(base["layers"], 6)
    with Model.load(base["path"]) as m:
        y = m(x)
        y2 = x.copy()
        assert m(y2, out=y2) is y2
        np.testing.assert_array_equal(y, y2)
        np.testing.assert_array_equal(m(x), y)
        assert_close(y, reference_stack(x, base["layers"]))


def test_load_errors_that_are_not_format_errors(tmp_path, lib):
    with pytest.raises(FileNotFoundError):
        Model.load(tmp_path / "nope.colibri")
    with pytest.raises(_lib.ColibriError) as ei:
        Model.load(tmp_path)  # a directory
    assert not isinstance(ei.value, ModelFormatError)
    assert "not a regular file" in str(ei.value)
    assert issubclass(ModelFormatError, _lib.ColibriError)


def _f32_layout() -> str:
    """The default library's f32 layout in its base kernel table (build_info.json)."""
    from colibri._lib import default_library_path
    info = json.loads((default_library_path().parent / "build_info.json").read_text())
    return info["knobs"].get("layout_f32", "rows")


def test_model_infer_null_and_bad_length(base, lib):
    from colibri._lib import ffi, last_error

    m = lib.colibri_load_model(str(base["path"]).encode())
    assert m != ffi.NULL
    try:
        buf = ffi.new("float[]", H)
        assert lib.colibri_infer(m, buf, buf, 0) == 1 and "seq_len 0" in last_error(lib)
        assert lib.colibri_infer(m, ffi.NULL, buf, 1) == 1 and "NULL" in last_error(lib)
        assert lib.colibri_infer(ffi.NULL, buf, buf, 1) == 1
        assert lib.colibri_model_layer(m, 2) == ffi.NULL and "out of range" in last_error(lib)
        layer = lib.colibri_model_layer(m, 1)
        # the file's pages (COLIBRI_PAGES_FILE) where this build reads f32 in place; the
        # pool's (normal, hugetlb or THP) where it packs f32 at load (zen4 since 2026-12-06)
        kind = lib.colibri_layer_page_kind(layer)
        assert kind in (0, 1, 2, 3)
        assert (kind == 3) == (_f32_layout() == "rows")
        lib.colibri_layer_free(layer)  # borrowed: ignored
        assert lib.colibri_model_n_layers(m) == 2
    finally:
        lib.colibri_free_model(m)
    assert lib.colibri_load_model(ffi.NULL) == ffi.NULL


# ------------------------------------------------------------------ writer behaviour

def test_save_model_rejects_inconsistent_layers(tmp_path):
    a = layer_dict(make_case(H, I, E, 2, seed=1))
    b = layer_dict(make_case(H, I + 8, E, 2, seed=2))
    with pytest.raises(ValueError, match=r"layers\[1\] has inter = 40, but layers\[0\] has 32"):
        save_model(tmp_path / "x.colibri", [a, b])
    with pytest.raises(ValueError, match="top_k"):
        save_model(tmp_path / "x.colibri", [a, dict(a, top_k=3)])
    with pytest.raises(ValueError, match="scoring"):
        save_model(tmp_path / "x.colibri", [a, dict(a, scoring="softmax_topk")])
    with pytest.raises(ValueError, match="shared"):
        c = layer_dict(make_case(H, I, E, 2, S=8, seed=3))
        save_model(tmp_path / "x.colibri", [a, c])
    assert not (tmp_path / "x.colibri").exists()


@pytest.mark.parametrize("bad, err", [
    (dict(gate=np.zeros((E, I, H + 1), np.float32)), ValueError),
    (dict(down=np.zeros((E, I, H), np.float32)), ValueError),
    (dict(router=np.zeros((E, H), np.int32)), TypeError),
    (dict(top_k=E + 1), ValueError),
    (dict(top_k=0), ValueError),
    (dict(scoring="sigmoid"), ValueError),
    (dict(shared_gate=np.zeros((8, H), np.float32)), ValueError),
    (dict(shared_expert_gate=np.zeros(H, np.float32)), ValueError),
    (dict(dyn_p=1.5), ValueError),
    (dict(gaet=np.zeros(1)), ValueError),
    (dict(router=np.full((E, H), np.nan, np.float32)), ValueError),
])
def test_save_model_rejects_bad_layers(tmp_path, bad, err):
    d = dict(layer_dict(make_case(H, I, E, 2, seed=1)), **bad)
    with pytest.raises(err):
        save_model(tmp_path / "x.colibri", [d])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kw", [dict(weight_dtype="fp8"), dict(alignment=96), dict(alignment=32)])
def test_save_model_rejects_bad_options(tmp_path, kw):
    with pytest.raises(ValueError):
        save_model(tmp_path / "x.colibri", [layer_dict(make_case(H, I, E, 2))], **kw)
    with pytest.raises(ValueError):
        save_model(tmp_path / "x.colibri", [])


def test_save_model_is_atomic(tmp_path):
    p = tmp_path / "m.colibri"
    good = layer_dict(make_case(H, I, E, 2, seed=1))
    save_model(p, [good])
    before = p.read_bytes()
    with pytest.raises(ValueError):
        save_model(p, [dict(good, top_k=99)])
    assert p.read_bytes() == before  # the old file is untouched
    save_model(p, [good, good])
    assert p.read_bytes() != before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.colibri"]  # no temp files left


def test_writer_layout_follows_the_spec(base):
    h = base["header"]
    raw = base["bytes"]
    assert struct.unpack_from("<I", raw, 0)[0] == 0xCAFE1234
    assert raw[108:128] == bytes(20)
    assert h["slot_table_offset"] >= 128 and h["slot_table_offset"] % 4 == 0
    assert h["tensor_table_offset"] % 8 == 0 and h["data_offset"] % h["alignment"] == 0
    for t in h["tensors"]:
        assert t["offset"] % h["alignment"] == 0 and t["reserved"] == 0
        assert zlib.crc32(raw[t["offset"]:t["offset"] + t["nbytes"]]) == t["crc32"]
    assert h["shared_inter"] == S and h["shared_gated"] == 1


def test_int8_payload_layout(tmp_path):
    """int8: rows*cols bytes, zero-padded to 4, then rows f32 scales (odd cols: padding)."""
    c = make_case(5, 3, 2, 1, seed=7)  # H=5, I=3: 15 bytes -> 1 byte of padding
    p = tmp_path / "q.colibri"
    save_model(p, [layer_dict(c)], weight_dtype="int8")
    h = read_header(p)
    raw = p.read_bytes()
    t = h["tensors"][1]  # expert 0 gate [3, 5]
    assert (t["dtype"], t["rows"], t["cols"], t["nbytes"]) == (2, 3, 5, 16 + 12)
    q, s = quant.quantize_int8(c.gate[0])
    o = t["offset"]
    assert raw[o:o + 15] == q.tobytes() and raw[o + 15:o + 16] == b"\0"
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4", 3, o + 16), s)
