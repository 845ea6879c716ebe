"""The AMX kernels on the emulated tile unit (profile sapphirerapids-amx-emulated): every
weight dtype at the token counts around the tile edges (1, 5, 16, 17, 64, 300) with a shared
expert and dynamic k, bf16, int8 and int4g32 both packed (the profile's layouts: the blocks
are B tiles, int4g32's unpacked to them) and in rows, int4 packed; the int tiles against the
dot-product kernels, bit for bit; and a
mutation check: the same kernels with a wrong tile stride must fail, or the corners that
pass on the emulator would prove nothing."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from moe_data import make_case

import numpy as np

import colibri
from colibri import quant, reference
from colibri._lib import build_profile, open_library
from colibri_build import cpuinfo, profiles, render

EMULATED = "sapphirerapids-amx-emulated"
ROOT = Path(__file__).resolve().parents[2]
DTYPES = ("f32", "bf16", "int8", "int4g32", "int4")
TOKENS = (1, 5, 16, 17, 64, 300)
# the weight tile loads: amx.j2's A tiles (rows AM_KC bf16 apart), amx_int.j2's (rows s0 bytes
# apart), amx_packed.j2's and amx_int_packed.j2's B tiles (the packed block's k-pairs and
# 4-k words, 64 bytes apart), amx_int4_packed.j2's (unpacked, 64 bytes apart)
STRIDES = {"amx.j2": "AM_KC * 2);", "amx_int.j2": "CB_TILE_LOADD(4, w0 + g * 32, s0);",
           "amx_packed.j2": "CB_TILE_LOADD({{ 6 + b }}, w{{ b }} + (size_t)s * 512, 64);",
           "amx_int_packed.j2": "CB_TILE_LOADD({{ 6 + b }}, w{{ b }} + (size_t)g * 512, 64);",
           "amx_int4_packed.j2": "CB_TILE_LOADD(6, ub + g * 512, 64);"}


@pytest.fixture(scope="module")
def runs_here():
    ok, why = profiles.runs_on(profiles.get_profile(EMULATED), cpuinfo.host_cpu())
    if not ok:
        pytest.skip(f"{EMULATED} cannot run on this host: {why}")


@pytest.fixture(scope="module")
def case():
    # dynamic k (2 to 4 experts a token by routing mass), a gated shared expert, rows and
    # columns that are not multiples of the tiles' 16 and 32
    return make_case(H=96, I=70, E=6, k=4, S=40, gated=True, dyn_p=0.7, k_min=2, k_max=4, seed=7)


@pytest.fixture(scope="module")
def tiled_case():
    # every matrix in whole 32-k tiles: packed bf16 takes the tiles in both projections
    return make_case(H=96, I=64, E=6, k=4, S=32, gated=True, dyn_p=0.7, k_min=2, k_max=4, seed=8)


def _products(lib):
    import ctypes
    count = ctypes.CDLL(str(lib)).cb_emu_products
    count.restype = ctypes.c_ulonglong
    return count


def _failures(lib, case, dtypes=DTYPES, tokens=TOKENS):
    bad = []
    for dtype in dtypes:
        L = colibri.MoELayer(case.router, case.gate, case.up, case.down, weight_dtype=dtype,
                             lib=lib, **case.layer_kwargs())
        for T in tokens:
            x = case.inputs(T, seed=T)
            ok, _, msg = reference.compare(L(x), case.reference(x, dtype), dtype)
            if not ok:
                bad.append(f"{dtype} T={T}: {msg}")
    return bad


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    """One build folder for the profile's four libraries: the objects outside the kernel
    parts do not depend on the knobs, so the builds after the first compile little else."""
    return tmp_path_factory.mktemp("amxbuild")


def _build(build_root, tmp_path_factory, name, cfg=None):
    """The library built in the shared folder, copied out (the next build replaces it there,
    and open_library keeps the library it first loaded from a path)."""
    built = build_profile(EMULATED, config=cfg, build_dir=build_root, quiet=True)
    out = tmp_path_factory.mktemp(name)
    for f in ("libcolibri.so", "build_info.json"):
        shutil.copy2(built.parent / f, out / f)
    return out / "libcolibri.so"


@pytest.fixture(scope="module")
def emulated_lib(runs_here, build_root, tmp_path_factory):
    """The profile's defaults: f32 (row layout), bf16, int8, int4g32 and int4 (packed) take the
    tiles."""
    return _build(build_root, tmp_path_factory, "amxemu")


@pytest.fixture(scope="module")
def other_lib(runs_here, build_root, tmp_path_factory):
    """The int tiles off (int8, int4g32 and int4 packed: the packed kernels) and bf16 in its
    row layout (amx.j2's tiles)."""
    cfg = render.write_config_h(tmp_path_factory.mktemp("cfg") / "other.h",
                                {"amx_int8": 0, "amx_int4": 0, "amx_int4k": 0, "layout_bf16": "rows"},
                                signature="0", profile=EMULATED)
    return _build(build_root, tmp_path_factory, "amxother", cfg)


@pytest.fixture(scope="module")
def rows_lib(runs_here, build_root, tmp_path_factory):
    """int8 and int4g32 in their row layouts on the tiles (amx_int.j2), and off them (the
    dot-product gemm)."""
    libs = []
    for amx in (1, 0):
        cfg = render.write_config_h(tmp_path_factory.mktemp("cfg") / f"rows{amx}.h",
                                    {"amx_int8": amx, "layout_int8": "rows", "amx_int4": amx, "layout_int4": "rows"},
                                    signature="0", profile=EMULATED)
        libs.append(_build(build_root, tmp_path_factory, f"amxrows{amx}", cfg))
    return libs


def test_every_dtype_is_right_on_the_emulated_tiles(emulated_lib, case):
    assert open_library(emulated_lib).colibri_uses_amx() == 1
    assert _failures(emulated_lib, case) == []


def test_bf16_is_right_on_the_tiles_packed_and_in_rows(emulated_lib, other_lib, tiled_case):
    """Packed bf16 reads its blocks as B tiles in both projections here (whole 32-k tiles),
    the row layout copies its k-tiles into A tiles; both on the tiles (the unit counts their
    products), at every token count, and the packed tiles give the same bits at every thread
    count (a block straddling two threads' rows is computed whole by each)."""
    for lib in (emulated_lib, other_lib):
        count = _products(lib)
        before = count()
        assert _failures(lib, tiled_case, dtypes=("bf16",)) == [], lib
        assert count() > before, f"{lib}: no tile products"
    x = tiled_case.inputs(300, seed=3)
    outs = [colibri.MoELayer(tiled_case.router, tiled_case.gate, tiled_case.up, tiled_case.down,
                             weight_dtype="bf16", lib=emulated_lib, threads=n,
                             **tiled_case.layer_kwargs())(x) for n in (1, 2, 3)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("dtype, share", [("bf16", 0.5), ("f32", 2 / 3)])
def test_activations_exact_in_bf16_skip_the_lo_products(emulated_lib, dtype, share):
    """A bf16 model's activations are exact in bf16: their lo halves are zero, and the gate/up
    tiles leave those products out (bf16 weights: 1 of 2, f32: 1 of 3), with the same result
    quality. The down projection's input (the engine's f32 h) keeps its lo products, so the
    layer issues between `share` and all of the products; the emulated unit counts them.
    (bf16 packed: whole 32-k tiles, which its tiles need.)"""
    c = make_case(H=320, I=288, E=2, k=1, seed=3)
    layer = colibri.MoELayer(c.router, c.gate, c.up, c.down, weight_dtype=dtype, lib=emulated_lib,
                             **c.layer_kwargs())
    count = _products(emulated_lib)
    x = c.inputs(300, seed=11)
    xb = quant.roundtrip(x, "bf16")  # exact in bf16
    done = {}
    for name, inp in (("f32", x), ("bf16-exact", xb)):
        before = count()
        ok, _, msg = reference.compare(layer(inp), c.reference(inp, dtype), dtype)
        assert ok, f"{name}: {msg}"
        done[name] = count() - before
    assert done["f32"] > 0
    assert share * done["f32"] < done["bf16-exact"] < 0.95 * done["f32"], done


@pytest.mark.parametrize("dtype, layout", [("int8", "interleaved"), ("int8", "rows"), ("int4g32", "rows"),
                                           ("int4g32", "interleaved"), ("int4", "interleaved")])
def test_int_on_tiles_gives_the_dot_product_kernels_bits(emulated_lib, other_lib, rows_lib, case, dtype,
                                                         layout):
    """amx_int8 / amx_int4 / amx_int4k sum each group in int32 and scale it in the dot-product
    kernels' order: the same bits as those kernels (the row layout: the dot-product gemm;
    packed int8, int4g32 and int4: the packed kernels), and the tiles ran (the unit counts
    their products). Packed int4g32 and int4 take the tiles from amx_int4_min_tokens (24)
    tokens an expert."""
    on, off = (emulated_lib, other_lib) if layout == "interleaved" else rows_lib
    count = _products(on)
    for c in (case, make_case(H=300, I=301, E=2, k=1, S=129, seed=3)):
        on_layer, off_layer = (colibri.MoELayer(c.router, c.gate, c.up, c.down, weight_dtype=dtype,
                                                lib=lib, **c.layer_kwargs()) for lib in (on, off))
        for T in (16, 17, 64, 300):
            x = c.inputs(T, seed=T)
            before = count()
            assert np.array_equal(on_layer(x), off_layer(x)), f"T={T}"
            if T == 300:
                assert count() > before, f"T={T}: no tile products"


@pytest.mark.parametrize("dtype", ["int8", "int4g32", "int4"])
def test_packed_int_on_tiles_gives_the_same_bits_at_every_thread_count(emulated_lib, tiled_case, dtype):
    """A packed block straddling two threads' rows is computed whole by each: the layer's
    output does not depend on the thread count."""
    x = tiled_case.inputs(300, seed=5)
    outs = [colibri.MoELayer(tiled_case.router, tiled_case.gate, tiled_case.up, tiled_case.down,
                             weight_dtype=dtype, lib=emulated_lib, threads=n,
                             **tiled_case.layer_kwargs())(x) for n in (1, 2, 3)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_a_wrong_tile_stride_fails_on_the_emulated_tiles(runs_here, case, tmp_path):
    """A copy of the build tree with the weight tiles' stride 64 bytes off: it builds, and the
    f32, bf16, int8, int4g32 and int4 layers it computes on tiles are wrong."""
    tree = tmp_path / "tree"
    for name in ("kernels", "templates", "profiles", "colibri_build"):
        shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "SConstruct", tree / "SConstruct")
    for name, stride in STRIDES.items():
        path = tree / "templates" / "expert_ffn" / name
        text = path.read_text()
        assert stride in text, f"{name} no longer loads its weight tiles this way"
        path.write_text(text.replace(stride, stride.replace(");", " + 64);")))
    env = dict(os.environ, PYTHONPATH=str(tree))
    res = subprocess.run([sys.executable, "-m", "SCons", "-Q", f"profile={EMULATED}",
                          f"build_dir={tmp_path / 'build'}"], cwd=tree, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lib = tmp_path / "build" / EMULATED / "libcolibri.so"
    bad = _failures(lib, case, dtypes=("f32", "bf16", "int8", "int4g32", "int4"), tokens=(300,))
    assert len(bad) == 5, bad


def test_the_amx_timing_script_says_whether_this_host_can_run_it():
    """scripts/amx-timing, the prepared run for an AMX host (docs/amx.md): --check answers
    at once, with the reason where the answer is no, and runs nothing."""
    res = subprocess.run([str(ROOT / "scripts" / "amx-timing"), "--check"], capture_output=True,
                         text=True, timeout=60)
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "amx_tile" in flags and "amx_int8" in flags:
        assert res.returncode == 0 and "has AMX" in res.stdout
    else:
        assert res.returncode == 3 and "nothing run" in res.stderr, res.stderr


def test_the_router_never_takes_the_tiles(other_lib, case):
    """The router's f32 logits feed a softmax, which magnifies their error: its rows take the
    f32 gemm (it gets a workspace) but never the tiles' bf16 split of f32, which the f32
    experts take from 32 tokens on. With the int tiles off, an int8 layer then issues no tile
    product at any token count (on real tiles, the split router put a bf16 layer's output
    1.1e-4 from the reference, past its 1e-4 tolerance)."""
    count = _products(other_lib)
    layer = colibri.MoELayer(case.router, case.gate, case.up, case.down, weight_dtype="int8",
                             lib=other_lib, **case.layer_kwargs())
    before = count()
    for T in (64, 300):
        x = case.inputs(T, seed=T)
        ok, _, msg = reference.compare(layer(x), case.reference(x, "int8"), "int8")
        assert ok, f"T={T}: {msg}"
    assert count() == before
