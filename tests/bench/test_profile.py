"""colibri_bench profile: libcolibri's own sampler (kernels/sample.c) and the naming of its
samples (by object, function and loop). What is checked is the attribution, not speed."""
import json
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from colibri._lib import ffi
from colibri_bench import profile

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64")


def test_maps_and_symbols_name_an_address():
    maps = profile.read_maps(
        "7f0000000000-7f0000010000 r-xp 00002000 fe:00 12 /x/libcolibri.so\n"
        "7f0000010000-7f0000020000 rw-p 00012000 fe:00 12 /x/libcolibri.so\n"
        "7f0000030000-7f0000031000 r-xp 00000000 00:00 0\n")
    assert maps == [(0x7F0000000000, 0x7F0000010000, 0x2000, "/x/libcolibri.so")]
    table = profile.read_symbols("0000000000003000 t gemm_a\n0000000000002000 T start\n"
                                 "0000000000004000 d data_not_code\n")
    assert table == ([0x2000, 0x3000], ["start", "gemm_a"])
    assert profile.symbol_at(table, 0x2FFF) == "start"
    assert profile.symbol_at(table, 0x3000) == "gemm_a"
    assert profile.symbol_at(table, 0x1000) == "?"


def test_loops_are_runs_of_near_addresses():
    runs = profile.loops_of(Counter({0x100: 3, 0x120: 1, 0x15F: 2, 0x400: 5}), gap=64)
    assert runs == [[0x100, 0x120, 0x15F], [0x400]]


def test_sampler_refuses_bad_calls(lib):
    n = ffi.new("size_t *")
    assert lib.colibri_sample_stop(ffi.NULL, 0, n, ffi.NULL) != 0  # not running
    assert b"not running" in ffi.string(lib.colibri_last_error())
    assert lib.colibri_sample_start(5, 100) != 0  # period below 100 us
    assert lib.colibri_sample_start(500, 0) != 0  # no room
    if not SAMPLES:
        assert lib.colibri_sample_start(500, 100) != 0
        return
    assert lib.colibri_sample_start(500, 100) == 0
    assert lib.colibri_sample_start(500, 100) != 0  # already running
    assert b"already running" in ffi.string(lib.colibri_last_error())
    assert lib.colibri_sample_stop(ffi.NULL, 0, n, ffi.NULL) == 0 and n[0] == 0


@pytest.mark.skipif(not SAMPLES, reason="the sampler needs Linux on x86-64 or aarch64")
def test_profile_of_the_tiny_shape_lands_in_the_kernels(tmp_path):
    out = tmp_path / "profile.json"
    res = subprocess.run([sys.executable, "-m", "colibri_bench", "profile", "--shape", "tiny",
                          "--phase", "prefill512", "--dtype", "f32", "--threads", "1", "--seconds", "1.5",
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["case"] == "tiny/prefill512/f32" and data["samples"] > 20
    objects = {r["name"]: r["share"] for r in data["objects"]}
    assert objects.get("libcolibri.so", 0) > 0.5, objects  # the timed loop is the engine's
    if data["nm"]:  # the f32 kernels by name (gate/up and down of the gemm or dot paths; where
        # the profile packs f32, the weight-as-vector kernels gateup_pf_*/rows_acc_pf_*; on AMX
        # hosts the tile gemm is inlined into the part's entry points, part_gateup/rows_acc)
        names = " ".join(r["name"] for r in data["functions"][:5])
        assert any(s in names for s in ("f32", "gemm", "_pf_", "libcolibri.so:part_")), names
    assert "ms per call" in res.stdout


def test_profile_refuses_an_unknown_case():
    res = subprocess.run([sys.executable, "-m", "colibri_bench", "profile", "--shape", "no-such-shape"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "no-such-shape" in res.stderr
