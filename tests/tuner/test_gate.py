"""The acceptance gate (tuner/gate.py) on injected cell measurements: a knob class of a shape
class whose domain holds a slower cell reverts to its defaults for that shape class only,
the gate re-checks, only the changed classes' cells are timed, a shape outside every tuned
class must run the default's code, and the record (the manifest's "gate") says which
class reverted and why."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from colibri_build import render, shapes
from tuner import gate
from tuner.build.signature import variant_id
from tuner.measure import problems

ROOT = Path(__file__).resolve().parents[2]
SPEC = render.load_knob_spec("expert_ffn", ROOT / "templates")
DEFAULT = {n: k.default for n, k in SPEC.knobs.items()} | {"isa": "avx512"}
TINY = shapes.class_of(256, 128)          # the tiny shape's class
QWEN3 = shapes.class_of(2048, 768)


def _tuner(tmp_path):
    said = []
    cfg = SimpleNamespace(gate_shapes=(), gate_threads=(1, 2), gate_rounds=5,
                          gate_min_seconds=0.01, seed=0, threads=2, worker_timeout_s=60)
    return SimpleNamespace(cfg=cfg, spec=SPEC, amx=False, classes=SPEC.classes(), default=dict(DEFAULT),
                           default_assignment=dict(DEFAULT),
                           say=said.append, said=said, work=tmp_path, store_path=tmp_path / "s.sqlite",
                           profile_name="generic", read_bandwidth=lambda: 40.0,
                           key=lambda k, p: f"{variant_id(k)}|{p.name}")


def _cell(problem, threads, ratios):
    r = gate.decide.ratio(ratios)
    return {"problem": problem, "threads": threads, "status": "ok", "default_s": 1.0,
            "candidate_s": 1 / r.median, "median": r.median, "lo": r.lo, "hi": r.hi,
            "rounds": r.rounds, "slower": r.slower, "faster": r.faster}


@pytest.fixture
def fake(monkeypatch):
    """_build, _check_outside and _measure replaced: cells at 1.0x +- 0.5% unless a rule of
    `slow` {(problem, threads): (still(candidate) -> bool, ratios)} holds for the candidate
    being measured; every measured candidate and problem set is recorded."""
    state = SimpleNamespace(slow={}, measured=[], outside_ok=True, cand=None)

    def build(t, cand):
        state.cand = dict(cand)
        return ["default.so", "candidate.so"]

    def outside(t, cand, libs, tuned, extra):
        s = gate.outside_shape(tuned, extra)
        return {"shape": s, "ok": state.outside_ok, "why": "runs the default's machine code"
                if state.outside_ok else "its layers run kernel table 'h22_i20'"}

    def measure(t, libs, probs, threads, owner):
        state.measured.append((dict(state.cand), [p.name for p in probs]))
        out = []
        for p in probs:
            for th in threads:
                rule = state.slow.get((p.name, th))
                slow = rule is not None and rule[0](state.cand)
                out.append(_cell(p.name, th, rule[1] if slow else [1.0, 1.005, 0.995, 1.0, 1.002]))
        return out

    monkeypatch.setattr(gate, "_build", build)
    monkeypatch.setattr(gate, "_check_outside", outside)
    monkeypatch.setattr(gate, "_measure", measure)
    return state


def _cand(**per_class):
    return shapes.join(DEFAULT, per_class)


def test_a_class_slower_on_a_cell_of_its_domain_reverts_for_its_shape_class_only(tmp_path, fake):
    t = _tuner(tmp_path)
    cand = _cand(**{TINY: {"rows": 1, "prefill_rows": 4}, QWEN3: {"rows": 1}})
    fake.slow[("tiny/decode/bf16", 2)] = (lambda c: shapes.for_class(c, TINY)["rows"] == 1,
                                          [0.95, 0.96, 0.94, 0.95, 0.955])
    rec = gate.run_gate(t, cand, {TINY: ["tiny"], QWEN3: ["qwen3-30b-a3b"]})
    assert set(rec["reverted"]) == {f"{TINY}/decode"}
    assert "tiny/decode/bf16 at 2 thread(s)" in rec["reverted"][f"{TINY}/decode"]["cells"][0]
    assert rec["reverted"][f"{TINY}/decode"]["knobs"]["rows"] == 1
    # the tiny class keeps its prefill knobs, Qwen3's class keeps its decode knobs
    assert shapes.for_class(rec["knobs"], TINY)["rows"] == DEFAULT["rows"]
    assert shapes.for_class(rec["knobs"], TINY)["prefill_rows"] == 4
    assert shapes.for_class(rec["knobs"], QWEN3)["rows"] == 1
    assert rec["knobs"]["rows"] == DEFAULT["rows"]             # the base stays the default
    assert len(rec["passes"]) == 2 and len(fake.measured) == 2  # re-checked after the fallback
    assert rec["passes"][1]["reverted"] == [] and rec["passed"]
    assert any(f"class decode of shape class {TINY} reverts" in s for s in t.said)
    # a second run of the same candidate takes the record, measuring nothing
    fake.measured.clear()
    again = gate.run_gate(t, cand, {TINY: ["tiny"], QWEN3: ["qwen3-30b-a3b"]})
    assert again["reverted"].keys() == {f"{TINY}/decode"} and fake.measured == []


def test_only_the_changed_classes_cells_are_timed(tmp_path, fake):
    t = _tuner(tmp_path)
    rec = gate.run_gate(t, _cand(**{TINY: {"prefetch_int8": 4096}}), {TINY: ["tiny"]})
    (_, timed), = fake.measured
    # decode_int8's domain: the decode path of int8, nothing else
    assert timed == ["tiny/decode/int8"]
    assert {(c["problem"], c["threads"]) for c in rec["cells"]} == {("tiny/decode/int8", 1),
                                                                     ("tiny/decode/int8", 2)}


def test_the_gate_covers_each_path_of_a_shape_with_few_experts(tmp_path, fake):
    # tiny has 16 experts, top-4: prefill128 and prefill512 are on the gemm path; the prefill
    # dot kernels run at prefill32, which the matrix adds. int4 has no gemm: its prefill
    # kernels run at every count
    t = _tuner(tmp_path)
    gate.run_gate(t, _cand(**{TINY: {"prefill_rows": 4}}), {TINY: ["tiny"]})
    (_, timed), = fake.measured
    assert {n.split("/")[1] for n in timed if not n.endswith("/int4")} == {"prefill32"}
    assert {n.split("/")[1] for n in timed if n.endswith("/int4")} == {"prefill32", "prefill128", "prefill512"}


def test_a_packed_int4_prefill_knob_is_gated_where_its_kernels_run(tmp_path, fake):
    # packed int4g32 runs the prefill class's kernels up to pk_gemm_min_tokens (128): qwen3's
    # prefill512 (32 tokens per expert) is on that path, and the gate times it; in the row
    # layout it is on the gemm path and prefill_prefetch_int4 does not reach it. int4 (always
    # packed, no gemm) runs them at both counts, whatever the layout knob
    t = _tuner(tmp_path)
    for layout, want in (("interleaved", {"prefill128", "prefill512"}), ("rows", {"prefill128"})):
        fake.measured.clear()
        t.default_assignment = t.default = {**DEFAULT, "layout_int4": layout}
        cand = shapes.join(t.default, {QWEN3: {"prefill_prefetch_int4": 4096}})
        gate.run_gate(t, cand, {QWEN3: ["qwen3-30b-a3b"]})
        (_, timed), = fake.measured
        assert {n.split("/")[1] for n in timed if n.endswith("/int4g32")} == want, layout
        assert {n.split("/")[1] for n in timed if n.endswith("/int4")} == {"prefill128", "prefill512"}
        assert {n.split("/")[2] for n in timed} == {"int4g32", "int4"}


def test_a_candidate_that_fails_a_cell_is_not_shipped(tmp_path, fake, monkeypatch):
    t = _tuner(tmp_path)
    cand = _cand(**{TINY: {"rows": 1, "prefetch_int4": 4096}})

    def measure(t_, libs, probs, threads, owner):
        bad = fake.cand != DEFAULT
        return [{"problem": p.name, "threads": th, "status": "wrong", "reason": "max relative error"}
                if bad and p.dtype == "int4g32" else _cell(p.name, th, [1.0] * 5)
                for p in probs for th in threads]
    monkeypatch.setattr(gate, "_measure", measure)
    rec = gate.run_gate(t, cand, {TINY: ["tiny"]})
    assert set(rec["reverted"]) == {f"{TINY}/decode", f"{TINY}/decode_int4"}
    assert rec["knobs"] == DEFAULT


def test_a_shape_outside_the_tuned_classes_that_does_not_run_the_default_reverts_all(tmp_path, fake):
    t = _tuner(tmp_path)
    fake.outside_ok = False
    rec = gate.run_gate(t, _cand(**{QWEN3: {"rows": 1}}), {QWEN3: ["qwen3-30b-a3b"]})
    assert rec["knobs"] == DEFAULT and set(rec["reverted"]) == {f"{QWEN3}/decode"}
    assert "olmoe-1b-7b" in rec["reverted"][f"{QWEN3}/decode"]["cells"][-1]


def test_the_default_needs_no_gate(tmp_path, fake):
    t = _tuner(tmp_path)
    rec = gate.run_gate(t, dict(DEFAULT), {QWEN3: ["qwen3-30b-a3b"]})
    assert rec["knobs"] == DEFAULT and rec["passes"] == [] and "default" in rec["note"]
    assert fake.measured == []


def test_the_outside_shape_is_one_no_tuned_class_holds():
    assert gate.outside_shape({QWEN3}) == "olmoe-1b-7b"
    assert gate.outside_shape({shapes.class_of(2048, 1024)}) == "qwen3-30b-a3b"
    assert gate.outside_shape({QWEN3}, ("mixtral-8x7b",)) == "mixtral-8x7b"


def test_validation_matrix_covers_every_dtype_and_phase():
    names = gate.matrix(["qwen3-30b-a3b"])
    assert len(names) == 3 * 5
    assert {n.split("/")[1] for n in names} == {"decode", "prefill128", "prefill512"}
    assert {n.split("/")[2] for n in names} == {"f32", "bf16", "int8", "int4g32", "int4"}
    # Mixtral's 8 experts: its prefill dot kernels run at prefill32
    assert "prefill32" in {n.split("/")[1] for n in gate.matrix(["mixtral-8x7b"])}
    assert all(problems.problem(n) for n in names)


def test_the_gate_stops_once_every_class_owning_an_open_cell_must_revert():
    def cell(problem, threads, ratios):
        c = _cell(problem, threads, ratios)
        c["settled"] = gate.decide.settled(gate.decide.ratio(ratios))
        return c

    noisy, clear_loss = [0.9, 1.1, 0.95, 1.08], [0.6, 0.62, 0.61]
    owner = {"a": ("sc", ["gemm", "gemm_bf16"]), "b": ("sc", ["gemm"]), "c": ("sc", ["igemm"])}
    # a noisy cell keeps the rounds going while a class owning it could still be kept
    assert gate.still_open([cell("a", 1, noisy), cell("b", 1, clear_loss)], owner)
    # once each of its owners has a cell settled below 1, its noise cannot change anything
    owner["b"] = ("sc", ["gemm", "gemm_bf16"])
    assert not gate.still_open([cell("a", 1, noisy), cell("b", 1, clear_loss)], owner)
    # a noisy cell of another class still counts
    assert gate.still_open([cell("a", 1, noisy), cell("b", 1, clear_loss), cell("c", 2, noisy)], owner)
    # a loss by its median alone (its interval reaching 1) settles nothing
    assert gate.still_open([cell("a", 1, noisy), cell("b", 1, [0.9, 1.01, 0.95])], owner)
