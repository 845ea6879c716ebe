"""kernels/crc32.c (slice-by-8, and carry-less folding on x86 with PCLMULQDQ for 256 bytes
and more) against zlib.crc32.

crc32.c is compiled on its own into a scratch shared object, so the check does not
depend on the engine build exporting the internal cb_crc32 symbol.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import zlib
from pathlib import Path

import cffi
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def crc(tmp_path_factory):
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc})")
    so = tmp_path_factory.mktemp("crc") / "libcrc.so"
    subprocess.run([cc, "-O2", "-std=c11", "-D_GNU_SOURCE", "-fPIC", "-shared",
                    f"-I{ROOT / 'kernels'}", str(ROOT / "kernels" / "crc32.c"), "-o", str(so),
                    "-lpthread"], check=True, capture_output=True)
    ffi = cffi.FFI()
    ffi.cdef("uint32_t cb_crc32(uint32_t crc, const void *data, size_t n);")
    lib = ffi.dlopen(str(so))

    def f(data: bytes, start: int = 0) -> int:
        return lib.cb_crc32(start, ffi.from_buffer(data), len(data))

    f.lib, f.ffi = lib, ffi
    return f


def test_check_value(crc):
    assert crc(b"123456789") == 0xCBF43926  # the CRC-32/ISO-HDLC check value


def test_lengths_and_alignments_match_zlib(crc):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 4096 + 16, dtype=np.uint8).tobytes()
    for start in range(8):  # every misalignment of the first byte
        for n in list(range(0, 70)) + [127, 128, 129, 1000, 4093, 4096] + list(range(240, 340)):
            chunk = data[start:start + n]
            assert crc(chunk) == zlib.crc32(chunk), (start, n)


def test_long_buffers_on_the_folding_path_match_zlib(crc):
    """Every remainder mod 16 and 64 past the folding's minimum, a start value carried in,
    and a buffer of a few MB (an expert's tensor)."""
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    for n in [256 + k for k in range(130)] + [1 << 20, (3 << 20) - 5]:
        for start in (0, 5):
            chunk = data[start:start + n]
            assert crc(chunk, 0xDEADBEEF) == zlib.crc32(chunk, 0xDEADBEEF), (start, n)


def test_continuation(crc):
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, 10007, dtype=np.uint8).tobytes()
    for cut in (0, 1, 7, 8, 9, 5000, 10007):
        assert crc(data[cut:], crc(data[:cut])) == zlib.crc32(data)
        assert crc(data[cut:], zlib.crc32(data[:cut])) == zlib.crc32(data)


def test_large_and_degenerate(crc):
    big = np.arange(1 << 20, dtype=np.uint32).tobytes()  # 4 MiB
    assert crc(big) == zlib.crc32(big)
    assert crc(b"") == 0 and crc(b"", 0x1234) == 0x1234
    assert crc.lib.cb_crc32(0xABCD, crc.ffi.NULL, 0) == 0xABCD
    assert crc(b"\xff" * 64) == zlib.crc32(b"\xff" * 64)
