"""The acceptance gate (tuner/gate.py) on injected cell measurements: a class whose domain
holds a slower cell reverts to its defaults, the gate re-checks, and its record (the
manifest's "gate") says which class reverted and why."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from colibri_build import render
from tuner import gate
from tuner.build.signature import variant_id
from tuner.measure import problems

ROOT = Path(__file__).resolve().parents[2]
SPEC = render.load_knob_spec("expert_ffn", ROOT / "templates")
DEFAULT = {n: k.default for n, k in SPEC.knobs.items()} | {"isa": "avx512"}


def _tuner(tmp_path):
    said = []
    cfg = SimpleNamespace(gate_shapes=("tiny",), gate_threads=(1, 2), gate_rounds=5,
                          gate_min_seconds=0.01, seed=0, threads=2)
    return SimpleNamespace(cfg=cfg, spec=SPEC, classes=SPEC.classes(), default=dict(DEFAULT),
                           say=said.append, said=said, work=tmp_path, store_path=tmp_path / "s.sqlite",
                           all_problems=[problems.problem("tiny/decode/f32")],
                           key=lambda k, p: f"{variant_id(k)}|{p.name}")


def _cell(problem, threads, ratios):
    r = gate.decide.ratio(ratios)
    return {"problem": problem, "threads": threads, "status": "ok", "default_s": 1.0,
            "candidate_s": 1 / r.median, "median": r.median, "lo": r.lo, "hi": r.hi,
            "rounds": r.rounds, "slower": r.slower, "faster": r.faster}


def _fake_measure(slow_cells, calls):
    """Every cell of the matrix at 1.0x +- 0.5%, except slow_cells {(problem, threads): ratios}
    while the candidate still has the knobs that made them slow (checked by `still`)."""
    def measure(t, cand, probs, threads, rounds=None):
        calls.append(dict(cand))
        out = []
        for p in probs:
            for th in threads:
                slow = [r for (name, n, still), r in slow_cells.items()
                        if name == p.name and n == th and still(cand)]
                out.append(_cell(p.name, th, slow[0] if slow else [1.0, 1.005, 0.995, 1.0, 1.002]))
        return out
    return measure


@pytest.fixture
def no_weights(monkeypatch):
    monkeypatch.setattr(gate.weights, "ensure", lambda *a, **k: None)


def test_a_class_slower_on_a_cell_of_its_domain_reverts_and_the_gate_rechecks(tmp_path, monkeypatch, no_weights):
    t = _tuner(tmp_path)
    cand = dict(DEFAULT, rows=1, prefill_rows=4)   # classes decode and prefill tuned
    calls = []
    slow = {("tiny/decode/bf16", 2, lambda c: c["rows"] == 1): [0.95, 0.96, 0.94, 0.95, 0.955]}
    monkeypatch.setattr(gate, "_measure", _fake_measure(slow, calls))
    rec = gate.run_gate(t, cand, [])
    assert set(rec["reverted"]) == {"decode"}
    assert "tiny/decode/bf16 at 2 thread(s)" in rec["reverted"]["decode"]["cells"][0]
    assert rec["reverted"]["decode"]["knobs"]["rows"] == 1
    assert rec["knobs"]["rows"] == DEFAULT["rows"] and rec["knobs"]["prefill_rows"] == 4
    assert len(rec["passes"]) == 2 and len(calls) == 2          # re-checked after the fallback
    assert rec["passes"][1]["reverted"] == [] and rec["passed"]
    assert len(rec["cells"]) == len(gate.matrix(["tiny"])) * 2   # every dtype x phase x threads
    assert any("class decode reverts to its defaults" in s for s in t.said)
    # a second run of the same candidate takes the record, measuring nothing
    calls.clear()
    assert gate.run_gate(t, cand, [])["reverted"].keys() == {"decode"} and calls == []


def test_a_clearly_slower_cell_outside_every_domain_reverts_all_tuned_classes(tmp_path, monkeypatch, no_weights):
    t = _tuner(tmp_path)
    cand = dict(DEFAULT, prefetch_f32=0)            # changes decode f32 code only
    slow = {("tiny/prefill512/int8", 1, lambda c: c["prefetch_f32"] == 0): [0.9, 0.91, 0.92, 0.9, 0.9]}
    monkeypatch.setattr(gate, "_measure", _fake_measure(slow, []))
    rec = gate.run_gate(t, cand, [])
    assert set(rec["reverted"]) == {"decode_f32"}
    assert "outside every tuned class's domain" in rec["reverted"]["decode_f32"]["cells"][0]
    assert rec["knobs"] == DEFAULT


def test_a_slight_consistent_difference_outside_every_domain_is_noted_not_reverted(tmp_path, monkeypatch, no_weights):
    t = _tuner(tmp_path)
    cand = dict(DEFAULT, prefetch_f32=0)
    slow = {("tiny/prefill512/int8", 1, lambda c: True): [0.995, 0.994, 0.996, 0.995, 0.993]}
    monkeypatch.setattr(gate, "_measure", _fake_measure(slow, []))
    rec = gate.run_gate(t, cand, [])
    assert rec["reverted"] == {} and rec["knobs"]["prefetch_f32"] == 0
    noted = [c for c in rec["cells"] if c.get("note")]
    assert [(c["problem"], c["threads"]) for c in noted] == [("tiny/prefill512/int8", 1)]


def test_a_candidate_that_fails_a_cell_is_not_shipped(tmp_path, monkeypatch, no_weights):
    t = _tuner(tmp_path)
    cand = dict(DEFAULT, rows=1, prefetch_int4=4096)

    def measure(t_, c, probs, threads, rounds=None):
        bad = c != DEFAULT
        return [{"problem": p.name, "threads": th, "status": "wrong", "reason": "max relative error"}
                if bad and p.dtype == "int4" else _cell(p.name, th, [1.0] * 5)
                for p in probs for th in threads]
    monkeypatch.setattr(gate, "_measure", measure)
    rec = gate.run_gate(t, cand, [])
    assert set(rec["reverted"]) == {"decode", "decode_int4"} and rec["knobs"] == DEFAULT


def test_the_default_needs_no_gate(tmp_path, monkeypatch, no_weights):
    t = _tuner(tmp_path)
    monkeypatch.setattr(gate, "_measure", lambda *a: pytest.fail("measured the default"))
    rec = gate.run_gate(t, dict(DEFAULT), [])
    assert rec["knobs"] == DEFAULT and rec["passes"] == [] and "default" in rec["note"]


def test_validation_matrix_covers_every_dtype_phase_and_an_untuned_shape():
    shapes = gate.validation_shapes(["qwen3-30b-a3b"])
    assert shapes[0] == "qwen3-30b-a3b" and len(shapes) == 2
    names = gate.matrix(shapes)
    assert len(names) == 2 * 3 * 4
    assert {n.split("/")[1] for n in names} == {"decode", "prefill128", "prefill512"}
    assert {n.split("/")[2] for n in names} == {"f32", "bf16", "int8", "int4"}
    assert gate.validation_shapes(["olmoe-1b-7b"])[1] == "qwen3-30b-a3b"


def test_a_cell_slower_only_by_a_noisy_median_is_measured_again_before_deciding(tmp_path, monkeypatch, no_weights):
    t = _tuner(tmp_path)
    cand = dict(DEFAULT, rows=1)
    asked = []

    def measure(t_, c, probs, threads, rounds=None):
        asked.append((len(probs), rounds))
        noisy = [0.7, 1.3, 0.96, 0.97, 1.0, 0.95]     # one disturbed round: median < 0.98
        return [_cell(p.name, th, noisy if (p.name, th) == ("tiny/decode/f32", 2) and rounds is None
                      else [1.0, 1.004, 0.997, 1.001, 1.0, 0.999])
                for p in probs for th in threads]
    monkeypatch.setattr(gate, "_measure", measure)
    rec = gate.run_gate(t, cand, [])
    assert rec["reverted"] == {} and rec["knobs"]["rows"] == 1
    assert asked[1] == (1, 2 * t.cfg.gate_rounds)                 # only that cell, twice the rounds
    again = next(c for c in rec["cells"] if c.get("first"))
    assert (again["problem"], again["threads"]) == ("tiny/decode/f32", 2) and again["first"]["slower"]
    assert not again["slower"]
