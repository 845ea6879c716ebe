"""colibri_bench overhead: its rows and JSON on a few calls (not speed)."""
import json

import pytest

from colibri_bench import overhead


def test_every_way_is_timed_and_the_wrappers_cost_is_their_difference():
    res = overhead.measure(rounds=2, calls=20)
    ways = {(r["kind"], r["way"]) for r in res["rows"]}
    assert {(k, w) for k in ("moe", "linear") for w in ("python", "engine", "engine-bf16")} <= ways
    assert all(r["seconds"] > 0 and len(r["round_seconds"]) == 2 for r in res["rows"])
    pytest.importorskip("torch")
    by = {(r["kind"], r["way"]): r["round_seconds"] for r in res["rows"]}
    for kind, suffix in [(k, s) for k in ("moe", "linear") for s in ("", "-bf16")]:
        o = res["wrapper_overhead"][kind + suffix]
        want = [1e6 * (a - b) for a, b in zip(by[(kind, "hf" + suffix)], by[(kind, "engine" + suffix)])]
        assert o["round_us"] == pytest.approx(want)
        assert o["within_budget"] == (o["us"] <= overhead.BUDGET_US)


def test_the_command_writes_its_json(tmp_path, capsys):
    out = tmp_path / "o.json"
    assert overhead.main(["--rounds", "1", "--calls", "10", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["shape"] == overhead.TINY and data["budget_us"] == 30.0
    assert "us/call" in capsys.readouterr().out
