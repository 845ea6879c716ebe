"""Search strategies: budgets, deduplication, determinism, start points, failures."""
from __future__ import annotations

import collections
import logging
import math
import random
import time

import pytest

from tuner import search
from tuner.search import (EXHAUSTED, MAX_EVALS, MAX_SECONDS, STRATEGIES, Budget, Evaluations,
                          BudgetExhausted, choose_default)
from tuner.search.space import Space

NAMES = list(STRATEGIES)
ISA_COST = {"avx512": 1.0, "avx2": 1.15, "portable": 1.6, "scalar": 3.0}
TARGET = {"rows": 4, "tok_block": 1, "unroll": 2, "prefetch": 1024}


@pytest.fixture(scope="module")
def ffn() -> Space:
    """A 460-point space shaped like expert_ffn's decode knobs (fixed here, not read from
    the template, so the tests do not move when the template evolves)."""
    return Space(knobs={"isa": ("avx512", "avx2", "portable", "scalar"), "rows": (1, 2, 4),
                        "tok_block": (1, 2, 4), "unroll": (1, 2, 4),
                        "prefetch": (0, 256, 512, 1024, 2048)},
                 constraints=["rows * tok_block * unroll <= 16"], name="ffn")


def bowl(p) -> float:
    """A smooth landscape with one optimum (avx512 at TARGET) and interacting knobs."""
    c = ISA_COST[p["isa"]]
    for k, best in TARGET.items():
        c *= 1 + 0.08 * abs(math.log2(max(p[k], 128) / max(best, 128)))
    if p["rows"] * p["unroll"] > 8:
        c *= 1.2
    return 1e-3 * c


class Counting:
    """An evaluator that records every call (to prove deduplication)."""

    def __init__(self, fn=bowl, fail=lambda p: False):
        self.fn, self.fail = fn, fail
        self.calls = collections.Counter()

    def __call__(self, p):
        self.calls[tuple(sorted(p.items()))] += 1
        return None if self.fail(p) else self.fn(p)


def optimum(space, fn=bowl):
    best = min((p for p in space.points() if fn(p) is not None), key=fn)
    return fn(best), best


# ---------------------------------------------------------------- Budget and Evaluations

def test_budget_values():
    assert Budget.of(10) == Budget(max_evals=10)
    assert Budget.of(None) == Budget()
    assert Budget.of(Budget(max_seconds=3.0)).max_seconds == 3.0
    for bad in (dict(max_evals=-1), dict(max_evals=2.5), dict(max_seconds=-1.0)):
        with pytest.raises(ValueError):
            Budget(**bad)
    with pytest.raises(TypeError):
        Budget.of("10")


def test_evaluations_deduplicate_count_and_stop(ffn):
    f = Counting()
    ev = Evaluations(ffn, f, Budget(max_evals=3))
    pts = ffn.points()
    assert ev(pts[0]) == bowl(pts[0])
    assert ev(dict(reversed(list(pts[0].items())))) == bowl(pts[0])   # same point, other order
    ev(pts[1])
    ev(pts[2])
    assert ev.used == 3 and sum(f.calls.values()) == 3
    assert ev(pts[1]) == bowl(pts[1])                                 # cached: still free
    with pytest.raises(BudgetExhausted) as exc:
        ev(pts[3])
    assert exc.value.reason == MAX_EVALS
    assert [p for p, _ in ev.history] == pts[:3]
    with pytest.raises(ValueError, match="outside the space"):
        Evaluations(ffn, f, Budget())({**pts[0], "rows": 3})


def test_evaluations_treat_non_finite_costs_as_failures(ffn):
    pts = ffn.points()
    ev = Evaluations(ffn, lambda p: float("nan") if p == pts[0] else (math.inf if p == pts[1] else 2.0),
                     Budget())
    assert ev(pts[0]) is None and ev(pts[1]) is None and ev(pts[2]) == 2.0
    assert ev.best_cost == 2.0
    with pytest.raises(TypeError, match="number or None"):
        Evaluations(ffn, lambda p: "fast", Budget())(pts[0])


# ---------------------------------------------------------------- every strategy

@pytest.mark.parametrize("name", NAMES)
def test_stops_exactly_at_max_evals_and_never_repeats_a_point(name, ffn):
    f = Counting()
    r = STRATEGIES[name].search(ffn, f, Budget(max_evals=40), rng=random.Random(3))
    assert r.evaluations == 40 == len(r.history) and r.stop_reason == MAX_EVALS
    assert max(f.calls.values()) == 1 and sum(f.calls.values()) == 40
    assert all(ffn.contains(p) for p, _ in r.history)
    assert r.best_cost == min(c for _, c in r.history) and r.strategy == name
    assert r.best_cost == bowl(r.best_point)


@pytest.mark.parametrize("name", NAMES)
def test_is_reproducible_from_its_seed(name, ffn):
    run = lambda seed: STRATEGIES[name].search(ffn, bowl, Budget(max_evals=30), rng=random.Random(seed))
    a, b = run(11), run(11)
    assert a.history == b.history
    if name != "exhaustive":
        assert run(12).history != a.history


@pytest.mark.parametrize("name", NAMES)
def test_start_points_go_first_and_invalid_ones_are_skipped(name, ffn):
    good = [{"isa": "scalar", "rows": 1, "tok_block": 4, "unroll": 4, "prefetch": 0},
            {"isa": "avx2", "rows": 2, "tok_block": 2, "unroll": 2, "prefetch": 512}]
    bad = [{"isa": "avx2", "rows": 4, "tok_block": 4, "unroll": 4, "prefetch": 0},  # constraint
           {"isa": "neon", "rows": 1, "tok_block": 1, "unroll": 1, "prefetch": 0},
           "isa=avx2"]
    r = STRATEGIES[name].search(ffn, bowl, Budget(max_evals=10), rng=random.Random(0),
                                start=[bad[0], good[0], bad[1], good[1], good[0], bad[2]])
    assert [p for p, _ in r.history[:2]] == good
    assert r.evaluations == 10


@pytest.mark.parametrize("name", NAMES)
def test_failed_points_are_never_chosen(name, ffn):
    fail = lambda p: p["isa"] == "avx512"      # the best region does not compile
    r = STRATEGIES[name].search(ffn, Counting(fail=fail), Budget(max_evals=120), rng=random.Random(1),
                                start=[{**TARGET, "isa": "avx512"}])
    assert r.history[0][1] is None
    assert r.best_point["isa"] != "avx512" and r.best_cost is not None


@pytest.mark.parametrize("name", NAMES)
def test_all_failed_gives_no_best(name):
    s = Space(knobs={"a": (1, 2, 3), "b": ("x", "y")})
    r = STRATEGIES[name].search(s, lambda p: None, Budget(), rng=random.Random(0))
    assert r.best_point is None and r.best_cost is None
    assert r.evaluations == 6 and r.stop_reason == EXHAUSTED


@pytest.mark.parametrize("name", NAMES)
def test_unlimited_budget_on_a_small_space_finds_the_optimum(name):
    s = Space(knobs={"isa": ("avx2", "portable"), "rows": (1, 2, 4), "prefetch": (0, 512, 1024)},
              constraints=["not (isa == 'portable' and rows == 4)"])
    fn = lambda p: ISA_COST[p["isa"]] * (1 + abs(p["rows"] - 2)) * (1 + abs(p["prefetch"] - 512) / 512)
    r = STRATEGIES[name].search(s, fn, Budget(), rng=random.Random(0))
    assert r.best_point == {"isa": "avx2", "rows": 2, "prefetch": 512}
    assert r.evaluations <= s.size() == 15


@pytest.mark.parametrize("name", NAMES)
def test_time_budget_stops_the_search(name, ffn):
    def slow(p):
        time.sleep(0.02)
        return bowl(p)
    t0 = time.monotonic()
    r = STRATEGIES[name].search(ffn, slow, Budget(max_seconds=0.3), rng=random.Random(0))
    assert r.stop_reason == MAX_SECONDS
    assert 3 <= r.evaluations <= 16
    assert time.monotonic() - t0 < 5.0


@pytest.mark.parametrize("name", ["annealing", "tpe"])
def test_guided_strategies_find_the_bowl_optimum_with_a_third_of_the_space(name, ffn):
    best_cost, best = optimum(ffn)
    for seed in range(3):
        r = STRATEGIES[name].search(ffn, bowl, Budget(max_evals=150), rng=random.Random(seed))
        assert r.best_cost <= best_cost * 1.02, (seed, r.best_point, best)


def test_exhaustive_visits_points_in_space_order(ffn):
    r = STRATEGIES["exhaustive"].search(ffn, bowl, Budget(max_evals=25), rng=None)
    assert [p for p, _ in r.history] == ffn.points()[:25]


def test_random_is_a_permutation(ffn):
    r = STRATEGIES["random"].search(ffn, bowl, Budget(), rng=random.Random(4))
    assert r.evaluations == ffn.size() and r.stop_reason == EXHAUSTED
    assert sorted(ffn.index(p) for p, _ in r.history) == list(range(ffn.size()))
    assert [ffn.index(p) for p, _ in r.history][:20] != list(range(20))


class Preparing(Counting):
    def __init__(self):
        super().__init__()
        self.prepared = []

    def prepare(self, points):
        self.prepared.append(list(points))


@pytest.mark.parametrize("name", ["exhaustive", "random"])
def test_known_orders_are_announced_for_batch_builds(name, ffn):
    f = Preparing()
    r = STRATEGIES[name].search(ffn, f, Budget(max_evals=30), rng=random.Random(2))
    assert len(f.prepared) == 1 and f.prepared[0] == [p for p, _ in r.history]


def test_annealing_options_are_checked(ffn):
    with pytest.raises(ValueError):
        STRATEGIES["annealing"].search(ffn, bowl, Budget(5), rng=0, cooling=1.5)
    with pytest.raises(ValueError):
        STRATEGIES["annealing"].search(ffn, bowl, Budget(5), rng=0, restart_from="nowhere")
    with pytest.raises(ValueError):
        STRATEGIES["annealing"].search(ffn, bowl, Budget(5), rng=0, pair_moves=2)
    r = STRATEGIES["annealing"].search(ffn, bowl, Budget(60), rng=0, restart_from="best")
    assert r.info["chains"] >= 1 and r.evaluations == 60


def test_tpe_is_silent_and_restores_optuna_logging(ffn, capsys, caplog):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.INFO)
    with caplog.at_level(logging.DEBUG):
        r = STRATEGIES["tpe"].search(ffn, bowl, Budget(max_evals=25), rng=random.Random(0),
                                     start=[{**TARGET, "isa": "avx2"}])
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
    assert not [rec for rec in caplog.records if rec.name.startswith("optuna")]
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
    assert r.info["enqueued"] >= 1 and r.info["trials"] >= 25
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_tpe_index_mode_and_fixed_seed(ffn):
    a = STRATEGIES["tpe"].search(ffn, bowl, Budget(30), rng=random.Random(0), ordinal="index", seed=5)
    b = STRATEGIES["tpe"].search(ffn, bowl, Budget(30), rng=random.Random(99), ordinal="index", seed=5)
    assert a.history == b.history and a.info["seed"] == 5
    with pytest.raises(ValueError):
        STRATEGIES["tpe"].search(ffn, bowl, Budget(5), rng=0, ordinal="log")


# ---------------------------------------------------------------- registry and defaults

def test_registry_modules_have_one_documented_entry_point():
    assert set(STRATEGIES) == {"exhaustive", "random", "annealing", "tpe"}
    for name, module in STRATEGIES.items():
        assert callable(module.search) and module.NAME == name
        assert "search(space, evaluate, budget" in module.__doc__


def test_choose_default(ffn):
    small = Space(knobs={"a": tuple(range(10))})
    assert choose_default(ffn, Budget(max_evals=460)) == "exhaustive"
    assert choose_default(ffn, Budget(max_evals=459)) == search.DEFAULT_SEARCH
    assert choose_default(ffn, Budget()) == "exhaustive"
    assert choose_default(ffn, Budget(max_seconds=600)) == search.DEFAULT_SEARCH
    assert choose_default(small, Budget(max_seconds=600)) == "exhaustive"
    assert choose_default(small, 5) == search.DEFAULT_SEARCH
    assert search.DEFAULT_SEARCH in STRATEGIES


def test_search_dispatches_by_name(ffn):
    r = search.search("random", ffn, bowl, 7, rng=3)
    assert r.strategy == "random" and r.evaluations == 7
    with pytest.raises(ValueError, match="unknown search strategy"):
        search.search("genetic", ffn, bowl, 7)


def test_result_helpers():
    r = search.Result("x", None, None, [({"a": 1}, 3.0), ({"a": 2}, None), ({"a": 3}, 1.0)],
                      3, MAX_EVALS, 0.0)
    assert r.best_curve() == [3.0, 3.0, 1.0]
    assert r.evaluations_to_reach(3.0) == 1 and r.evaluations_to_reach(2.0) == 3
    assert r.evaluations_to_reach(0.5) is None
