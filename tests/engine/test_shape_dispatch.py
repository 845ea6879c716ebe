"""Tuned values apply only where they were measured: a library built from a config.h with a
shape class runs that class's kernel table for layers whose sizes fall in it, and the base
knobs' table ("default") for every other layer (kernels/dispatch.c, colibri_build/shapes.py,
docs/shape-classes.md). Built for the generic profile (portable C), so it runs anywhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri import reference
from colibri_build import render, shapes

ROOT = Path(__file__).resolve().parents[2]
H, I = 256, 128                      # the tiny shape: class h16_i14
OTHER_I = 192                        # bin 15: outside it
CLASS = shapes.class_of(H, I)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """A generic library whose config.h gives the class other decode and prefill knobs."""
    d = tmp_path_factory.mktemp("shape-dispatch")
    knobs = shapes.join({"isa": "portable"}, {CLASS: {"rows": 1, "prefill_rows": 4, "isa": "scalar"}})
    config = render.write_config_h(d / "config.h", knobs, "0123abcd", "generic")
    env = {k: v for k, v in os.environ.items() if k != "COLIBRI_BUILD_DIR"}
    res = subprocess.run([sys.executable, "-m", "SCons", "-Q", "-j2", "profile=generic",
                          f"build_dir={d / 'build'}", f"config={config}"], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return d / "build" / "generic"


def _layer(inter, lib, dtype="f32", E=4, seed=0):
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.standard_normal(s, dtype=np.float32) * np.float32(1 / np.sqrt(s[-1]))  # noqa: E731
    router, gate, up, down = w(E, H) * np.float32(3), w(E, inter, H), w(E, inter, H), w(E, H, inter)
    layer = colibri.MoELayer(router, gate, up, down, top_k=2, weight_dtype=dtype,
                             lib=None if lib is None else str(lib))
    return layer, (router, gate, up, down)


def test_a_layer_in_the_tuned_class_runs_its_table_and_others_the_default(tuned):
    lib = tuned / "libcolibri.so"
    inside, _ = _layer(I, lib)
    outside, _ = _layer(OTHER_I, lib)
    assert inside.kernels == CLASS
    assert outside.kernels == render.DEFAULT_TABLE
    info = json.loads((tuned / "build_info.json").read_text())
    assert info["shape_classes"] == {CLASS: {"isa": "scalar", "prefill_rows": 4, "rows": 1}}
    # both tables are the engine: the same answers as the float64 reference, decode and prefill
    for inter in (I, OTHER_I):
        layer, (router, gate, up, down) = _layer(inter, lib)
        for T in (1, 40):
            x = reference.inputs_with_margin(router, T, top_k=2, seed=T)
            ref = reference.moe_layer(x, router, gate, up, down, top_k=2)
            ok, rel, msg = reference.compare(layer(x), ref, "f32")
            assert ok, (inter, T, msg)


def test_the_class_table_is_other_code_and_the_default_table_the_base_knobs(tuned):
    from colibri_build import parts
    from tuner.build import codehash

    tables = parts.read_tables(tuned / "kernel_tables.json")
    assert set(tables) == {"default", CLASS}
    # the class's isa reaches every dtype's part
    assert [p for p in parts.PARTS if tables["default"][p] == tables[CLASS][p]] == []
    for p in parts.PARTS:
        base = codehash.function_hashes(parts.object_path(tuned, tables["default"][p]))
        mine = codehash.function_hashes(parts.object_path(tuned, tables[CLASS][p]))
        assert base and mine and codehash.differing(base, mine)
    gen = (tuned / "gen" / "parts" / f"{tables[CLASS]['f32']}.c").read_text().split("*/")[0]
    assert "part: f32" in gen and "isa=scalar" in gen and "rows=1" in gen
    table_c = (tuned / "gen" / "kernel_tables.c").read_text()
    assert f'cbk_kernels_{CLASS} = {{"{CLASS}", {{&{tables[CLASS]["f32"]},' in table_c


def test_a_model_file_layer_picks_its_table_when_loaded(tuned, tmp_path):
    lib = tuned / "libcolibri.so"
    rng = np.random.default_rng(1)
    w = lambda *s: rng.standard_normal(s, dtype=np.float32) * np.float32(0.05)  # noqa: E731
    layers = [dict(router=w(4, H), gate=w(4, inter, H), up=w(4, inter, H), down=w(4, H, inter), top_k=2)
              for inter in (I,)]
    colibri.save_model(tmp_path / "m.colibri", layers)
    with colibri.Model.load(tmp_path / "m.colibri", lib=str(lib)) as m:
        assert m.layer_kernels(0) == CLASS
    colibri.save_model(tmp_path / "o.colibri", [dict(router=w(4, H), gate=w(4, OTHER_I, H),
                                                     up=w(4, OTHER_I, H), down=w(4, H, OTHER_I), top_k=2)])
    with colibri.Model.load(tmp_path / "o.colibri", lib=str(lib)) as m:
        assert m.layer_kernels(0) == render.DEFAULT_TABLE


def test_the_default_build_runs_the_classes_its_profile_promotes_and_the_default_elsewhere(lib):
    from colibri._lib import default_library_path

    info = json.loads(Path(default_library_path()).with_name("build_info.json").read_text())
    promoted = info.get("shape_classes") or {}
    layer, _ = _layer(I, None)
    assert layer.kernels == (CLASS if CLASS in promoted else render.DEFAULT_TABLE)
    layer, _ = _layer(OTHER_I, None)
    assert layer.kernels == (shapes.class_of(H, OTHER_I) if shapes.class_of(H, OTHER_I) in promoted
                             else render.DEFAULT_TABLE)


def test_c_and_python_put_every_size_in_the_same_bin(lib):
    ns = list(range(1, 5000)) + [int(2 ** (b / 2 + s)) + d for b in range(2, 41)
                                 for s in (-0.25, 0.25) for d in (-1, 0, 1)]
    ns = sorted({n for n in ns if 1 <= n <= 1 << 20})
    assert [lib.colibri_shape_bin(n) for n in ns] == [shapes.bin_of(n) for n in ns]
    assert lib.colibri_shape_bin(0) == -1


def test_shape_class_names_and_ranges():
    assert shapes.class_of(2048, 768) == "h22_i19"
    assert shapes.class_of(4096, 14336) == "h24_i28"
    assert shapes.class_of(2048, 1024) == "h22_i20"       # OLMoE is not Qwen3's class
    lo, hi = shapes.bin_range(19)
    assert shapes.bin_of(lo) == shapes.bin_of(hi) == 19
    assert shapes.bin_of(lo - 1) == 18 and shapes.bin_of(hi + 1) == 20
    with pytest.raises(ValueError):
        shapes.parse("h22-i19")
    knobs = shapes.join({"rows": 2}, {"h22_i19": {"rows": 1}, "h24_i28": {"rows": 2}})
    assert knobs == {"rows": 2, "shapes": {"h22_i19": {"rows": 1}}}  # no-op classes dropped
    assert shapes.for_class(knobs, "h22_i19") == {"rows": 1}
    assert shapes.for_class(knobs, "h24_i28") == {"rows": 2}


def test_config_h_carries_the_shape_classes_and_reads_back():
    knobs = shapes.join({"rows": 2, "isa": "avx512"}, {"h22_i19": {"rows": 1}})
    text = render.format_config_h(knobs, "ab12", "zen5")
    assert "#define COLIBRI_SHAPE_H22_I19_ROWS 1" in text
    back = render.parse_config_h(text)
    assert back.knobs == {"rows": 2, "isa": "avx512"} and back.shapes == {"h22_i19": {"rows": 1}}
    assert back.assignment == knobs
