"""Replay: strategies run against recorded results stores instead of a machine.

The strategy comparison runs over every store in tests/fixtures/stores/*.sqlite
(recorded by exhaustive runs on real machines) and over a synthetic store generated
here. The synthetic store is laid out as `python -m tuner run` records one: the real
expert_ffn space split into its problem classes, the decode class (isa and the decode
block knobs; 340 points) measured on the decode problem and the prefill class (the
prefill_* knobs, isa fixed; 115 points) on the prefill problem. Its costs come from a
model of a bandwidth-bound decode and a compute-bound prefill with interacting knobs
(register pressure, latency hiding, prefetch distance per stream count), +-3%
measurement noise, and some failed variants (compile error, crash, wrong, timeout).
`pytest -s tests/tuner/test_replay.py` prints the table of evaluations needed.
"""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from colibri_build.render import load_knob_spec
from tuner.search.replay import (ReplayError, ReplayMissing, compare_strategies, main,
                          replay_evaluator)
from tuner.search import STRATEGIES, Budget
from tuner.build.signature import signature
from tuner.search.space import Space
from tuner.store import Measurement, Store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stores"
KERNEL = "expert_ffn"
DECODE = "qwen3-30b-a3b/decode/f32"
PREFILL = "qwen3-30b-a3b/prefill64/f32"
TOLERANCE = 0.05
SEEDS = range(5)
# Budgets, as fractions of the space.
# Synthetic store: the guided strategies get about a third of the space. Random
# search needs more: to hit one of k near-best points among N with 99% probability
# it needs about N * (1 - 0.01 ** (1 / k)) evaluations: 34% of the synthetic decode
# class (k = 11 of 340 within 5%) but 60% of the prefill class (k = 5 of 115).
BUDGETS = {"annealing": 0.35, "tpe": 0.35, "random": 0.6}
# Recorded stores: the one of the 2-vCPU VM (expert_ffn-emr-vm) is noise-bound: 4 of
# 276 points lie within 5% of the best, scattered (portable and avx512, rows 1 and 4)
# with spreads of 3-9%, so no strategy beats random there. Over 200 seeds (TPE: 30)
# the evaluations needed to get within 5% were, median / 95th percentile / max:
# annealing 37 / 125 / 170, TPE 46 / 147 / 168, random 44 / 126 / 193. A third of the
# space is not enough on such a store; two thirds is.
RECORDED_BUDGETS = {"annealing": 0.65, "tpe": 0.65, "random": 0.65}
MIN_SPACE = 50     # smaller recorded spaces are not a search problem worth replaying


# ------------------------------------------------------------------ synthetic store

ISAS = ["avx512", "avx2", "portable", "scalar"]
DECODE_KNOBS = ("isa", "rows", "tok_block", "unroll", "prefetch_f32")
PREFILL_KNOBS = ("prefill_rows", "prefill_tok_block", "prefill_unroll", "prefill_prefetch_f32")
# compute time per call relative to the DRAM time of streaming the weights once
COMPUTE = {"scalar": 2.6, "portable": 1.05, "avx2": 0.5, "avx512": 0.3}
VECTOR_REGS = {"scalar": 16, "portable": 16, "avx2": 16, "avx512": 32}


def decode_cost(p: dict) -> float:
    """Seconds per call of a Qwen3-30B-A3B expert at T=1 on a made-up 2-channel Zen 4."""
    isa, rows, tb, unroll, pf = (p[k] for k in DECODE_KNOBS)
    ilp = min(1.0, rows * unroll / 8) ** 0.6          # ~8 FMA chains hide the latency
    spills = max(0, rows * tb * unroll + rows + tb - VECTOR_REGS[isa])
    compute = COMPUTE[isa] / ilp * (1 + 0.12 * spills) * tb ** 0.35   # padded token lanes
    ideal = 2048 // rows                              # more rows = more streams = shorter
    pf_eff = 0.80 if pf == 0 else 1.0 - 0.05 * abs(math.log2(pf / ideal))
    dram = 1.0 / (pf_eff * {1: 0.92, 2: 0.98, 4: 1.0}[rows])
    return 400e-6 * (max(dram, compute) + 0.15 * min(dram, compute))


def prefill_cost(p: dict) -> float:
    """Seconds per call at T=64: compute-bound, the register tile decides."""
    isa = p["isa"]
    rows, tb, unroll, pf = (p[k] for k in PREFILL_KNOBS)
    acc = rows * tb * unroll
    ilp = min(1.0, acc / 10) ** 0.7
    loads = (rows + tb) / (rows * tb)                 # operand loads per FMA
    spills = max(0, acc + rows + tb - VECTOR_REGS[isa])
    compute = 4.0 * COMPUTE[isa] / ilp * (1 + 0.35 * loads) * (1 + 0.12 * spills)
    pf_eff = 0.9 if pf == 0 else 1.0 - 0.03 * abs(math.log2(pf / 512))
    dram = 1.0 / tb ** 0.8 / pf_eff                   # weights reused across the token block
    return 400e-6 * (max(dram, compute) + 0.15 * min(dram, compute))


def synthetic_failure(p: dict, problem: str) -> tuple[str, str] | None:
    if problem == DECODE:
        if p["isa"] == "avx2" and p["rows"] == 4 and p["prefetch_f32"] == 2048:
            return "crash", "signal 11 (SIGSEGV): prefetch beyond the last weight row"
        if p["isa"] == "portable" and p["tok_block"] == 2 and p["unroll"] == 4:
            return "wrong", "max relative error 3.1e-02 > 1e-05 against the NumPy reference"
        if p["isa"] == "avx512" and p["unroll"] == 4 and p["rows"] == 4:
            return "compile_error", "error: inlining failed in call to 'always_inline' '_mm512_fmadd_ps'"
    elif p["prefill_rows"] == 1 and p["prefill_unroll"] == 4 and p["prefill_tok_block"] == 4:
        return "timeout", "no result in 60 s (killed)"
    return None


def class_spaces() -> dict[str, Space]:
    """The decode and prefill class spaces of the real template, as `tuner run` splits them."""
    spec = load_knob_spec(KERNEL)
    full = Space.from_spec(spec, ISAS)
    default = {n: k.default for n, k in spec.knobs.items()}
    fixed_for_prefill = {**default, "isa": "avx512"}
    return {
        DECODE: full.subspace(**{n: [default[n]] for n in spec.knobs if n not in DECODE_KNOBS}),
        PREFILL: full.subspace(**{n: [fixed_for_prefill[n]] for n in spec.knobs
                                  if n not in PREFILL_KNOBS}),
    }


def write_synthetic_store(path: Path, seed: int = 7) -> Path:
    rng = random.Random(seed)
    with Store(path) as st:
        for problem, space in class_spaces().items():
            cost_of = decode_cost if problem == DECODE else prefill_cost
            for p in space.points():
                key = signature(host_fingerprint="synthetic-zen4", compiler="gcc",
                                compiler_version="12.2.0", flags=["-O3", "-march=znver4"],
                                template_source="synthetic", knobs=p, problem={"name": problem})
                common = dict(key=key, kernel=KERNEL, problem=problem, knobs=p,
                              host_id="synthetic-zen4", profile="zen4", created=1.7e9)
                failure = synthetic_failure(p, problem)
                if failure:
                    st.put(Measurement(status=failure[0], reason=failure[1], **common))
                else:
                    cost = cost_of(p) * (1 + rng.uniform(-0.03, 0.03))
                    st.put(Measurement(status="ok", median_s=cost, spread=0.02, samples=21, **common))
    return path


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> Path:
    return write_synthetic_store(tmp_path_factory.mktemp("stores") / "expert_ffn-synthetic.sqlite")


def _cases():
    cases = [pytest.param("synthetic", KERNEL, DECODE, id=f"synthetic-{DECODE}"),
             pytest.param("synthetic", KERNEL, PREFILL, id=f"synthetic-{PREFILL}")]
    for path in sorted(FIXTURES.glob("*.sqlite")):
        with Store(path, readonly=True) as st:
            for kernel, problem in st.problems():
                cases.append(pytest.param(path, kernel, problem, id=f"{path.stem}-{kernel}-{problem}"))
    return cases


# ------------------------------------------------------------------ the comparison

@pytest.mark.parametrize("store, kernel, problem", _cases())
def test_each_strategy_gets_within_5_percent_of_the_exhaustive_best(store, kernel, problem, synthetic):
    path = synthetic if store == "synthetic" else store
    evaluate = replay_evaluator(path, kernel, problem)
    if evaluate.space.size() < MIN_SPACE:
        pytest.skip(f"only {evaluate.space.size()} points recorded")
    budgets = BUDGETS if store == "synthetic" else RECORDED_BUDGETS
    report = compare_strategies(path, kernel, problem, list(budgets), budgets, SEEDS,
                                tolerance=TOLERANCE)
    print("\n" + report.format())
    for run in report.runs:
        print(f"    {run.strategy:<10} seed {run.seed}: {run.evals_to_target} evaluations "
              f"(budget {run.budget}), best/best {run.ratio:.3f}")
    assert report.near_points >= 1
    missed = [(r.strategy, r.seed, round(r.ratio, 3)) for r in report.runs if not r.reached]
    assert not missed, f"runs that did not get within {TOLERANCE:.0%}: {missed}\n{report.format()}"
    for run in report.runs:
        assert run.evaluations <= run.budget


def test_exhaustive_replay_finds_the_recorded_best(synthetic):
    with Store(synthetic, readonly=True) as st:
        best = st.best(KERNEL, DECODE)
    ev = replay_evaluator(synthetic, KERNEL, DECODE)
    r = STRATEGIES["exhaustive"].search(ev.space, ev, Budget(), rng=0)
    assert r.best_cost == best.median_s and r.best_point == best.knobs
    assert r.evaluations == ev.space.size() == class_spaces()[DECODE].size()
    report = compare_strategies(synthetic, KERNEL, DECODE, ["exhaustive"], None, [0])
    assert report.runs[0].ratio == 1.0 and report.best_cost == best.median_s


# ------------------------------------------------------------------ the evaluator

def test_replay_evaluator_answers_from_the_store(synthetic):
    ev = replay_evaluator(synthetic, KERNEL, DECODE)
    with Store(synthetic, readonly=True) as st:
        rows = st.query(kernel=KERNEL, problem=DECODE)
    ok = next(m for m in rows if m.ok)
    bad = next(m for m in rows if m.status == "crash")
    assert ev(ok.knobs) == ok.median_s
    assert ev(bad.knobs) is None
    assert ev.space.size() == len(rows) == class_spaces()[DECODE].size()
    assert ev.space.knobs["prefetch_f32"] == tuple(load_knob_spec(KERNEL).knobs["prefetch_f32"].values)
    assert ev.space.categorical == {"isa", "layout_int8", "layout_int4", "layout_bf16", "layout_f32"}  # the knobs whose values are names
    missing = {**ok.knobs, "prefetch_f32": 3000}   # a distance the template does not offer
    with pytest.raises(ReplayMissing, match="was not recorded"):
        ev(missing)
    assert replay_evaluator(synthetic, KERNEL, DECODE, missing="fail")(missing) is None


def test_replayed_space_is_the_recorded_points(tmp_path):
    path = tmp_path / "partial.sqlite"
    knobs = [{"isa": i, "rows": r} for i in ("avx2", "scalar") for r in (1, 2, 4) if (i, r) != ("scalar", 4)]
    with Store(path) as st:
        for n, k in enumerate(knobs):
            st.put(Measurement(key=f"k{n}", kernel="k", problem="p", knobs=k, status="ok",
                               median_s=1.0 + n))
    ev = replay_evaluator(path, "k", "p")
    assert ev.space.size() == 5 and not ev.space.contains({"isa": "scalar", "rows": 4})
    assert {q["rows"] for q in ev.space.neighbours({"isa": "scalar", "rows": 2})} == {1, 2}


def test_several_hosts_need_a_host_id_and_the_latest_measurement_counts(tmp_path, synthetic):
    merged = tmp_path / "merged.sqlite"
    point = dict(class_spaces()[DECODE].points()[5])
    with Store(merged) as st:
        st.merge_from(synthetic)
        st.put(Measurement(key="other-host", kernel=KERNEL, problem=DECODE, knobs=point,
                           status="ok", median_s=1.0, host_id="other", created=1.8e9))
    with pytest.raises(ReplayError, match="host_id"):
        replay_evaluator(merged, KERNEL, DECODE)
    assert replay_evaluator(merged, KERNEL, DECODE, host_id="other")(point) == 1.0
    with Store(merged) as st:     # a re-measurement on the same host replaces the older one
        st.put(Measurement(key="again", kernel=KERNEL, problem=DECODE, knobs=point, status="ok",
                           median_s=2.0, host_id="synthetic-zen4", created=1.9e9))
    assert replay_evaluator(merged, KERNEL, DECODE, host_id="synthetic-zen4")(point) == 2.0
    with pytest.raises(ReplayError, match="no measurements"):
        replay_evaluator(merged, KERNEL, "mixtral/decode/f32")


def test_replay_never_changes_the_store_file(tmp_path, synthetic):
    with Store(synthetic, readonly=True) as st:
        fixture = st.snapshot(tmp_path / "fixture.sqlite")
    before = fixture.read_bytes()
    compare_strategies(fixture, KERNEL, PREFILL, ["random", "annealing"], 0.2, [0])
    assert fixture.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixture.sqlite"]


def test_compare_strategies_is_deterministic(synthetic):
    a = compare_strategies(synthetic, KERNEL, DECODE, ["random", "annealing"], 0.3, [1, 2])
    b = compare_strategies(synthetic, KERNEL, DECODE, ["random", "annealing"], 0.3, [1, 2])
    assert a.runs == b.runs and len(a.runs) == 4
    assert [s["strategy"] for s in a.summary()] == ["random", "annealing"]
    assert a.runs[0].budget == round(0.3 * class_spaces()[DECODE].size())
    with pytest.raises(ValueError, match="unknown strategy"):
        compare_strategies(synthetic, KERNEL, DECODE, ["genetic"], 10, [0])
    with pytest.raises(ValueError, match="no budget"):
        compare_strategies(synthetic, KERNEL, DECODE, ["random"], {"tpe": 10}, [0])


# ------------------------------------------------------------------ the CLI

def test_cli_prints_a_table_per_problem(synthetic, capsys):
    rc = main([str(synthetic), "--strategies", "random,annealing", "--seeds", "0,1", "--runs"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"replay expert_ffn / {DECODE}" in out and f"replay expert_ffn / {PREFILL}" in out
    assert "evals to within 5%" in out and "annealing" in out and "seed 1" in out


def test_cli_filters_checks_and_reports_errors(synthetic, capsys, tmp_path):
    assert main([str(synthetic), "--problem", PREFILL, "--strategies", "annealing",
                 "--seeds", "2", "--check"]) == 0
    out = capsys.readouterr().out
    assert PREFILL in out and DECODE not in out
    # two evaluations cannot find a point within 0.1% of the best: --check fails
    assert main([str(synthetic), "--problem", DECODE, "--strategies", "random", "--budget", "2",
                 "--tolerance", "0.001", "--seeds", "1", "--check"]) == 1
    capsys.readouterr()
    assert main([str(synthetic), "--kernel", "route"]) == 2
    assert "recorded: expert_ffn/" in capsys.readouterr().err
    assert main([str(tmp_path / "none.sqlite")]) == 2
    assert "does not exist" in capsys.readouterr().err
