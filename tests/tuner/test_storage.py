"""The storage class (tuner/storage.py): its knobs file holds the build's defaults; on a
simulated measure the search and race adopt a point only when it is faster beyond noise,
never a failing one; and, bounded, `python -m tuner storage` on a small model under a memory
cgroup (skipped where none can be made)."""
import json
import math
import re

import numpy as np
import pytest
from moe_data import write_repeated_model

from colibri import storage_settings
from colibri_build.paths import KERNELS_DIR
from tuner import storage
from tuner.measure import cgroup


def test_the_knobs_defaults_are_the_builds_and_their_values_are_valid_options():
    src = (KERNELS_DIR / "internal.h").read_text()
    macro = lambda name: re.search(rf"#define {name} (\S+)", src).group(1)  # noqa: E731
    want = {"io_threads": int(macro("COLIBRI_IO_THREADS")), "read_depth": int(macro("COLIBRI_READ_DEPTH")),
            "direct_io": int(macro("COLIBRI_DIRECT_IO")),
            "policy": macro("COLIBRI_CACHE_POLICY").rsplit("_", 1)[1].lower()}
    knobs = storage.load_knobs()
    assert storage.defaults(knobs) == want
    for k in knobs:
        lo, hi = storage_settings.RANGES[k.name]
        for v in k.values:
            assert lo <= storage.options({k.name: v})[k.name] <= hi


def test_a_malformed_knobs_file_is_refused(tmp_path):
    f = tmp_path / "k.yaml"
    f.write_text("knobs:\n  io_threads: {values: [1, 2], default: 4}\n")
    with pytest.raises(ValueError, match="io_threads's default"):
        storage.load_knobs(f)
    f.write_text("knobs:\n  threads: {values: [1], default: 1}\n")
    with pytest.raises(ValueError, match="not a read option"):
        storage.load_knobs(f)


def _simulated(speedups: dict, noise: float = 0.01, fail=None, seed=0):
    """A measure: 1 ms a token times 1/speedup of each knob value named, times noise."""
    rng = np.random.default_rng(seed)

    def measure(point, cell):
        if fail and fail(point):
            raise storage.RunFailed("simulated failure")
        s = 1e-3 * (2.0 if cell == "prefill" else 1.0)
        for (k, v), f in speedups.items():
            if point[k] == v:
                s /= f
        return s * math.exp(rng.normal(0, noise))
    return measure


def test_a_point_faster_beyond_noise_is_adopted():
    knobs = storage.load_knobs()
    res = storage.tune(knobs, ["decode", "prefill"], _simulated({("io_threads", 2): 1.3, ("policy", "lfu"): 1.1}),
                       rounds=(3, 6), say=lambda *_: None)
    assert res["adopted"] and res["winner"]["io_threads"] == 2 and res["winner"]["policy"] == "lfu"
    assert res["screen"][0]["point"] == storage.defaults(knobs)  # the default measured first
    assert len({storage.label(s["point"]) for s in res["screen"]}) == len(res["screen"])  # each point once


def test_noise_alone_keeps_the_default():
    knobs = storage.load_knobs()
    res = storage.tune(knobs, ["decode"], _simulated({}, noise=0.05, seed=3), quick=True, rounds=(3, 5),
                       say=lambda *_: None)
    assert not res["adopted"] and res["winner"] == storage.defaults(knobs)


def test_a_failing_point_is_never_adopted_and_a_failing_default_is_an_error():
    knobs = storage.load_knobs()
    res = storage.tune(knobs, ["decode"], _simulated({("direct_io", -1): 2.0}, fail=lambda p: p["direct_io"] == -1),
                       rounds=(3, 5), say=lambda *_: None)
    assert res["winner"]["direct_io"] == 1
    assert all(not math.isfinite(s["cost"]) for s in res["screen"] if s["point"]["direct_io"] == -1)
    with pytest.raises(storage.RunFailed, match="default"):
        storage.tune(knobs, ["decode"], _simulated({}, fail=lambda p: True), say=lambda *_: None)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # 6 layers, 75 MB: at half of it, the process fits beside a budget of half the experts
    return write_repeated_model(tmp_path_factory.mktemp("storage") / "m.colibri", seed=3)


def test_the_command_tunes_a_small_model_under_a_cgroup(model, tmp_path, monkeypatch, capsys):
    try:
        cgroup.cgroup_root()
    except cgroup.NoCgroup as e:
        pytest.skip(str(e))
    from tuner.__main__ import main

    trace = np.random.default_rng(1).standard_normal((24, 512), dtype=np.float32)
    np.save(tmp_path / "trace.npy", trace)
    out, settings = tmp_path / "storage.json", tmp_path / "settings.json"
    rc = main(["storage", "--model", str(model), "--trace", str(tmp_path / "trace.npy"), "--share", "0.5",
               "--decode", "8", "--prefill", "16", "--quick", "--finalists", "1", "--rounds", "2,2",
               "--margin-mib", "12", "--threads", "2", "--out", str(out), "--settings", str(settings)])
    text = capsys.readouterr().out
    assert rc == 0, text
    rec = json.loads(out.read_text())
    assert rec["screen"][0]["point"] == storage.defaults(storage.load_knobs())
    assert all(math.isfinite(s["cost"]) and s["cost"] > 0 for s in rec["screen"])  # every point: the same bits
    assert rec["race"]["rounds"] == 2 and len(rec["race"]["candidates"]) == 1
    assert rec["trace"]["rows"] == 24 and rec["budget"] == rec["limit"] - (12 << 20)
    runs = rec["runs"]
    assert runs and all(r["rc"] == 0 and r["oom_kills"] == 0 and r["stats"]["misses"] > 0 for r in runs)
    assert all(r["stats"]["peak_rss_bytes"] <= rec["limit"] for r in runs)
    assert "| point | ms/token |" in text and "winner:" in text
    monkeypatch.setenv("COLIBRI_STORAGE", str(settings))
    assert storage_settings.load() == storage.options(rec["winner"])


@pytest.mark.parametrize("argv,msg", [(["--rounds", "3"], "--rounds"), (["--model", "/nonexistent"], "no such file"),
                                      (["--decode", "0", "--prefill", "0"], "nothing to run")])
def test_usage_errors(argv, msg, capsys):
    from tuner.__main__ import main

    try:
        cgroup.cgroup_root()
    except cgroup.NoCgroup:
        if msg == "no such file":
            pytest.skip("the cgroup check comes first")
    assert main(["storage", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_a_bad_trace_is_refused(tmp_path):
    np.save(tmp_path / "t.npy", np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="not \\[tokens, 8\\]"):
        storage.load_trace(tmp_path / "t.npy", 8)
    (tmp_path / "t.bin").write_bytes(b"\0" * 12)
    with pytest.raises(ValueError, match="not rows"):
        storage.load_trace(tmp_path / "t.bin", 8)
    np.save(tmp_path / "n.npy", np.full((2, 8), np.nan, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        storage.load_trace(tmp_path / "n.npy", 8)
