"""A model file four times larger than a memory cgroup's limit, run under that limit with a
memory budget (Model.load(memory_budget=), kernels/expert_cache.c): no OOM kill, the same
output bits as an unlimited run, and a peak resident set within the budget plus a stated
margin. The program in the cgroup is kernels/tools/infer_model.c (C, so the limit is not
spent on an interpreter). Needs a writable memory cgroup (v2 memory.max or v1
memory.limit_in_bytes, as root); skips naming the reason where there is none."""
import json
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from moe_data import make_case

from colibri._lib import default_library_path
from colibri.modelfile import ModelWriter
from tuner.measure import cgroup

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "kernels" / "tools" / "infer_model.c"

LIMIT = 32 << 20   # the cgroup's limit
BUDGET = 12 << 20  # the model's memory budget under it
# What the process holds besides the budget (whose share includes the read buffers): the
# library and libgomp, thread stacks, the activations and one call's scratch.
MARGIN = 12 << 20
H, I, E, K, LAYERS = 512, 256, 64, 8, 6  # int8: 25 MB of experts a layer, 151 MB in all


@contextmanager
def memory_cgroup(limit):
    """colibri_bench.cgroup's group, or a skip naming why there is none."""
    try:
        with cgroup.memory_cgroup(limit, tag="colibri-test") as got:
            yield got
    except cgroup.NoCgroup as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """An int8 model file of LAYERS layers (one layer encoded, its stored bytes copied: each
    copy its own tensors), well over four times LIMIT."""
    d = tmp_path_factory.mktemp("limit")
    case = make_case(H=H, I=I, E=E, k=K, seed=21)
    path = d / "big.colibri"
    with ModelWriter(path, weight_dtype="int8", share=False) as w:
        w.add_layer(dict(router=case.router, gate=case.gate, up=case.up, down=case.down, **case.layer_kwargs()))
        for _ in range(LAYERS - 1):
            w.repeat_layer(0)
    assert path.stat().st_size >= 4 * LIMIT
    return path


@pytest.fixture(scope="module")
def infer_model(tmp_path_factory):
    lib = default_library_path().resolve()
    exe = tmp_path_factory.mktemp("tool") / "infer_model"
    cmd = [shutil.which("cc") or "gcc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'kernels'}", str(SOURCE),
           "-o", str(exe), str(lib), f"-Wl,-rpath,{lib.parent}", "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    return exe


@pytest.mark.parametrize("mode,T", [("decode", 200), ("prefill", 128)])
def test_a_model_four_times_the_limit_runs_under_it(big_model, infer_model, tmp_path, mode, T):
    x = np.random.default_rng(T).standard_normal((T, H), dtype=np.float32)
    inp = tmp_path / "x.bin"
    x.tofile(inp)
    extra = ["decode"] if mode == "decode" else []
    want = tmp_path / "want.bin"
    subprocess.run([str(infer_model), str(big_model), str(inp), str(T), str(want), "0", *extra],
                   check=True, capture_output=True)
    got = tmp_path / "got.bin"
    cgroup.drop_from_page_cache(big_model)
    with memory_cgroup(LIMIT) as (version, cg):
        r = cgroup.run_in(cg, [str(infer_model), str(big_model), str(inp), str(T), str(got), str(BUDGET), *extra])
        kills = cgroup.oom_kills(version, cg)
    assert r.returncode == 0, f"exit {r.returncode} (OOM kills {kills}): {r.stderr}"
    assert kills == 0
    stats = json.loads(r.stdout)
    np.testing.assert_array_equal(np.fromfile(got, np.float32), np.fromfile(want, np.float32))
    assert stats["budget_bytes"] == BUDGET and stats["resident_bytes"] <= BUDGET
    assert stats["misses"] > stats["cache_slots"] and stats["evictions"] > 0  # the cache turned over
    assert stats["peak_rss_bytes"] <= BUDGET + MARGIN, stats


def test_without_a_budget_the_same_run_is_killed_by_the_limit(big_model, infer_model, tmp_path):
    """The cgroup above does limit: the model's packed experts alone are over four times it."""
    x = np.random.default_rng(0).standard_normal((4, H), dtype=np.float32)
    x.tofile(tmp_path / "x.bin")
    cgroup.drop_from_page_cache(big_model)
    with memory_cgroup(LIMIT) as (version, cg):
        r = cgroup.run_in(cg, [str(infer_model), str(big_model), str(tmp_path / "x.bin"), "4", str(tmp_path / "y.bin")])
        kills = cgroup.oom_kills(version, cg)
    assert r.returncode == -9 or kills > 0, f"exit {r.returncode}, OOM kills {kills}: {r.stderr}"
