"""colibri.safetensors: the reader against hand-built files (the format as specified, not
as our writer happens to write it), the writer round trip, and every validation error
naming the file and the tensor."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from colibri import quant
from colibri.safetensors import (SafetensorsError, SafetensorsFile, parse_header,
                                 raw_to_float32, save_safetensors)


def build(path, header: dict, data: bytes, *, pad: int = 0, length: int | None = None):
    """A safetensors file from parts: 8-byte LE length, JSON header, data."""
    text = json.dumps(header).encode() + b" " * pad
    n = len(text) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + text + data)
    return path


def open_error(path) -> str:
    with pytest.raises(SafetensorsError) as ei:
        SafetensorsFile(path)
    msg = str(ei.value)
    assert str(path) in msg  # every error names the file
    return msg


# ------------------------------------------------------------------ reading the spec

def test_reads_hand_built_file_of_each_float_dtype(tmp_path):
    a32 = np.arange(6, dtype="<f4").reshape(2, 3) / 7
    a16 = np.array([1.5, -2.25, 65504.0], dtype="<f2")
    bf = np.array([0x3F80, 0xC040, 0x0000, 0x7F80], dtype="<u2")  # 1, -3, 0, inf
    a64 = np.array([[1e-3], [2.5]], dtype="<f8")
    parts, hdr, off = [], {"__metadata__": {"format": "pt"}}, 0
    for name, arr, dt in (("w32", a32, "F32"), ("w16", a16, "F16"), ("wbf", bf, "BF16"),
                          ("w64", a64, "F64")):
        b = arr.tobytes()
        hdr[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        parts.append(b)
        off += len(b)
    p = build(tmp_path / "m.safetensors", hdr, b"".join(parts), pad=5)  # padded header is legal
    with SafetensorsFile(p) as f:
        assert f.metadata == {"format": "pt"}
        assert list(f) == ["w32", "w16", "wbf", "w64"] and len(f) == 4 and "w16" in f
        assert f.info("wbf").shape == (4,) and f.info("wbf").nbytes == 8
        np.testing.assert_array_equal(f.to_float32("w32"), a32)
        np.testing.assert_array_equal(f.to_float32("w16"), a16.astype(np.float32))
        np.testing.assert_array_equal(f.to_float32("wbf"), [1.0, -3.0, 0.0, np.inf])
        np.testing.assert_array_equal(f.to_float32("w64"), a64.astype(np.float32))
        assert all(f.to_float32(n).dtype == np.float32 for n in f)
        # F32 is a view of the read-only mapping: no copy, no writes
        v = f.to_float32("w32")
        assert not v.flags.writeable and v.base is not None
        raw = f.raw("wbf")
        assert raw.dtype == np.uint16 and raw.tolist() == bf.tolist()
        with pytest.raises(KeyError, match="no tensor 'nope'"):
            f.info("nope")


def test_bf16_widening_is_a_shift_of_the_bits():
    bits = np.array([0x4049, 0xBF00, 0x0001], dtype=np.uint16)  # 3.140625, -0.5, a subnormal
    out = raw_to_float32(bits, "BF16")
    assert out.view(np.uint32).tolist() == [b << 16 for b in bits.tolist()]
    with pytest.raises(ValueError, match="I32"):
        raw_to_float32(np.zeros(2, np.int32), "I32")


def test_integer_tensor_reads_raw_but_refuses_float32(tmp_path):
    q = np.array([-3, 7, 127], dtype=np.int8)
    p = build(tmp_path / "q.safetensors",
              {"q": {"dtype": "I8", "shape": [3], "data_offsets": [0, 3]}}, q.tobytes())
    with SafetensorsFile(p) as f:
        assert f.raw("q").tolist() == [-3, 7, 127]
        with pytest.raises(SafetensorsError, match=r"tensor 'q' has dtype I8"):
            f.to_float32("q")


def test_empty_and_scalar_tensors(tmp_path):
    p = build(tmp_path / "e.safetensors",
              {"empty": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]},
               "scalar": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}},
              struct.pack("<f", 2.5))
    with SafetensorsFile(p) as f:
        assert f.to_float32("empty").shape == (0, 4)
        assert f.to_float32("scalar").shape == () and float(f.to_float32("scalar")) == 2.5


# ------------------------------------------------------------------ writer

def test_writer_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    t = {"a": rng.standard_normal((3, 5), dtype=np.float32),
         "b": rng.standard_normal(7).astype(np.float16),
         "c": np.arange(4, dtype=np.int64), "d": rng.standard_normal((2, 2))}
    p = tmp_path / "w.safetensors"
    save_safetensors(p, t, metadata={"k": "v"})
    raw = p.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    assert n % 8 == 0  # the data section starts 8-byte aligned
    hdr = json.loads(raw[8:8 + n])
    assert {k: v["dtype"] for k, v in hdr.items() if k != "__metadata__"} == \
        {"a": "F32", "b": "F16", "c": "I64", "d": "F64"}
    with SafetensorsFile(p) as f:
        assert f.metadata == {"k": "v"}
        np.testing.assert_array_equal(f.to_float32("a"), t["a"])
        np.testing.assert_array_equal(f.to_float32("b"), t["b"].astype(np.float32))
        assert f.raw("c").tolist() == [0, 1, 2, 3]
        np.testing.assert_array_equal(f.to_float32("d"), t["d"].astype(np.float32))


def test_writer_bf16_rounds_to_nearest(tmp_path):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 8), dtype=np.float32)
    p = tmp_path / "b.safetensors"
    save_safetensors(p, {"w": a, "n": np.arange(3, dtype=np.int32)}, dtype="BF16")
    with SafetensorsFile(p) as f:
        assert f.info("w").dtype == "BF16" and f.info("n").dtype == "I32"  # ints keep theirs
        np.testing.assert_array_equal(f.to_float32("w"), quant.roundtrip(a, "bf16"))
    save_safetensors(p, {"w": a, "x": a}, dtype={"x": "F16"})
    with SafetensorsFile(p) as f:
        assert (f.info("w").dtype, f.info("x").dtype) == ("F32", "F16")


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(tensors={"a": np.zeros(2, np.complex64)}), TypeError, "no safetensors dtype"),
    (dict(tensors={"a": np.zeros(2, np.int8)}, dtype={"a": "BF16"}), TypeError, "needs a float"),
    (dict(tensors={"a": np.zeros(2)}, dtype="F12"), ValueError, "unknown dtype 'F12'"),
    (dict(tensors={"__metadata__": np.zeros(2)}), ValueError, "tensor name"),
    (dict(tensors={"a": np.zeros(2)}, metadata={"k": 1}), TypeError, "metadata"),
])
def test_writer_refuses_bad_input(tmp_path, kwargs, exc, match):
    p = tmp_path / "bad.safetensors"
    with pytest.raises(exc, match=match):
        save_safetensors(p, **kwargs)
    assert not p.exists() and list(tmp_path.iterdir()) == []  # no partial file left


# ------------------------------------------------------------------ validation

GOOD = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


def test_file_shorter_than_the_length_field(tmp_path):
    p = tmp_path / "tiny.safetensors"
    p.write_bytes(b"\x01\x02\x03")
    assert "3 bytes, shorter than the 8-byte header length" in open_error(p)


def test_missing_file(tmp_path):
    assert "cannot open" in open_error(tmp_path / "absent.safetensors")


def test_header_length_past_the_end(tmp_path):
    p = build(tmp_path / "h.safetensors", GOOD, bytes(16), length=10_000)
    assert "header length 10000 runs past the end of the file" in open_error(p)


def test_absurd_header_length(tmp_path):
    p = tmp_path / "big.safetensors"
    p.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    assert "over the" in open_error(p)


def test_bad_json(tmp_path):
    p = tmp_path / "j.safetensors"
    text = b'{"w": {"dtype": "F32",'
    p.write_bytes(struct.pack("<Q", len(text)) + text)
    assert "not valid JSON" in open_error(p)


def test_header_not_utf8(tmp_path):
    p = tmp_path / "u.safetensors"
    p.write_bytes(struct.pack("<Q", 2) + b"\xff\xfe")
    assert "not UTF-8" in open_error(p)


def test_header_not_an_object(tmp_path):
    p = build(tmp_path / "l.safetensors", [1, 2], b"")
    assert "must be a JSON object, got list" in open_error(p)


@pytest.mark.parametrize("entry, data, fragment", [
    ({"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}, 8, "unknown dtype 'F7'"),
    ({"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}, 16,
     "span 12 bytes, but shape [2, 2] of F32 needs 16"),
    ({"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}, 8,
     "span 8 bytes, but shape [3] of BF16 needs 6"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, 12,
     "data_offsets [0, 16] end past the data section (12 bytes)"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}, 8, "0 <= begin <= end"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}, 8, "0 <= begin <= end"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0]}, 8, "data_offsets must be [begin, end]"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, 8, "shape must be a list"),
    ({"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}, 8, "shape must be a list"),
    ({"dtype": "F32", "shape": [2]}, 8, "the entry lacks data_offsets"),
    ("F32", 8, "the entry must be an object"),
])
def test_bad_tensor_entry_names_the_tensor(tmp_path, entry, data, fragment):
    p = build(tmp_path / "t.safetensors", {"model.w": entry}, bytes(data))
    msg = open_error(p)
    assert "tensor 'model.w'" in msg and fragment in msg


def test_overlapping_tensors(tmp_path):
    hdr = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    msg = open_error(build(tmp_path / "o.safetensors", hdr, bytes(12)))
    assert "tensors 'a' [0, 8) and 'b' [4, 12) overlap" in msg


def test_truncated_file(tmp_path):
    p = tmp_path / "full.safetensors"
    save_safetensors(p, {"x": np.ones((4, 4), np.float32), "y": np.ones((8, 8), np.float32)})
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(p.read_bytes()[:-10])
    msg = open_error(cut)
    assert "tensor 'y'" in msg and "end past the data section" in msg and "truncated" in msg


def test_bad_metadata(tmp_path):
    p = build(tmp_path / "m.safetensors", {"__metadata__": {"a": 3}, **GOOD}, bytes(16))
    assert "__metadata__ must be an object of strings" in open_error(p)


def test_parse_header_directly():
    tensors, meta = parse_header(json.dumps(GOOD).encode(), 16, "mem")
    assert meta == {} and tensors["w"].shape == (2, 2) and tensors["w"].end == 16
    with pytest.raises(SafetensorsError, match="^mem: "):
        parse_header(b"[]", 0, "mem")
