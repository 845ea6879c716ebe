"""colibri_bench offload, bounded: a small model file under a memory cgroup, the budgeted
runs' bits against an unlimited run, the report's fields, table and plot (the plain-mmap
way needs a library built in the stored layout: the full command builds it, this test does
not). Skips naming the reason where no memory cgroup can be made."""
import json

import pytest

from moe_data import write_repeated_model

from colibri_bench import offload
from tuner.measure import cgroup


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_repeated_model(tmp_path_factory.mktemp("offload") / "m.colibri")  # 6 layers, 75 MB


def test_budgeted_runs_under_a_limit_a_quarter_of_the_file(model, tmp_path):
    try:
        cgroup.cgroup_root()
    except cgroup.NoCgroup as e:
        pytest.skip(str(e))
    rep = offload.offload(model, shares=[0.5, 0.25], decode=8, prefill=16, rounds=1, threads=2, reads={},
                          work=tmp_path / "work", mmap=False, margin=12 << 20, say=lambda *_: None)
    runs = rep["runs"]
    assert [(r["share"], r["phase"]) for r in runs] == [(0.5, "decode"), (0.5, "prefill"), (0.25, "decode"),
                                                         (0.25, "prefill")]
    for r in runs:
        assert r["rc"] == 0 and r["oom_kills"] == 0, r
        assert r["same_bits"] and r["tok_s"] > 0
        st = r["stats"]
        assert st["misses"] > 0 and st["peak_rss_bytes"] <= r["limit"]
        assert st["budget_bytes"] == r["budget"] == r["limit"] - (12 << 20)
    assert rep["expert_bytes"] < rep["file_bytes"] and runs[-1]["limit"] * 4 <= rep["file_bytes"]
    cells = rep["summary"]
    assert [(c["share"], c["phase"]) for c in cells] == [(0.5, "decode"), (0.5, "prefill"), (0.25, "decode"),
                                                          (0.25, "prefill")]
    for c in cells:
        assert 0 <= c["budget"]["hit_rate"] <= 1 and c["budget"]["same_bits"]
        assert 0 <= c["budget"]["wait_seconds"] <= c["budget"]["stall_seconds"]
        assert "mmap" not in c and "ratio" not in c
    text = offload.table(rep)
    assert "| 0.25 | decode |" in text and "| - | - | - |" in text
    assert all(c["budget"]["load_seconds"] > 0 for c in cells)
    json.dumps(rep)  # the JSON the command writes
    png = offload.plot(rep, tmp_path / "offload.png")
    assert png is None or png.stat().st_size > 1000


def test_a_limit_under_the_margin_is_refused_before_anything_runs(model, tmp_path):
    with pytest.raises(ValueError, match="leaves nothing past"):
        offload.offload(model, shares=[1.0, 0.1], decode=1, prefill=0, rounds=1, threads=1, reads={},
                        work=tmp_path, mmap=False, margin=64 << 20, say=lambda *_: None)
    assert not list(tmp_path.iterdir())  # nothing built, nothing written


def test_cli_usage_errors(capsys):
    from colibri_bench.__main__ import main

    assert main(["offload", "--decode", "0", "--prefill", "0"]) == 2
    assert "nothing to run" in capsys.readouterr().err
    assert main(["offload", "--share", "1.5"]) == 2
    assert main(["offload", "--model", "/nonexistent/m.colibri"]) == 2
