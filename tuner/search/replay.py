"""Replay: run search strategies against a recorded results store instead of a machine.

A store recorded by an exhaustive run holds the cost of every point of a kernel's space
for a problem. Replaying it answers "which strategy finds a near-best variant, in how
many evaluations?" in seconds and without a quiet machine (Kernel Tuner's cache-file
trick), so strategies are tested and compared deterministically.

replay_evaluator(store, kernel, problem)  -> evaluate(point) -> recorded median_s
compare_strategies(store, kernel, problem, strategies, budgets, seeds) -> ReplayReport
main(argv)                                   `python -m tuner replay STORE ...`

The replayed space is exactly the set of recorded points (knob values as recorded,
numbers in ascending order, strings sorted; a point is valid iff it was recorded), so
no template or profile is needed and a constraint of the recording run is respected
implicitly. When templates/<kernel>.knobs.yaml declares the same knobs, its
constraints tell which knob pairs are coupled (Space.coupled, for pair moves). Recorded failures (compile_error, crash, wrong, ...) replay as None.
A point that was not recorded is an error (ReplayMissing, a KeyError) by default;
missing="fail" replays it as a failed variant instead.
"""
from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from colibri import _cli
from colibri_build.render import KnobError, load_knob_spec
from tuner.build.signature import canonical_json, variant_id
from tuner.search import STRATEGIES, Budget, make_rng
from tuner.search.space import Space
from tuner.store import Measurement, Store, StoreError

DEFAULT_TOLERANCE = 0.05
DEFAULT_BUDGET_FRACTION = 0.35


class ReplayMissing(KeyError):
    """A strategy asked for a point the recorded store does not hold."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "point not recorded"


class ReplayError(ValueError):
    """The store cannot be replayed for this kernel/problem (empty, mixed hosts, ...)."""


def _open(store_or_path: Store | str | os.PathLike) -> tuple[Store, bool]:
    if isinstance(store_or_path, Store):
        return store_or_path, False
    return Store(store_or_path, readonly=True), True


def _sort_values(values: Iterable[Any]) -> tuple:
    values = list(values)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return tuple(sorted(values))
    return tuple(sorted(values, key=lambda v: (type(v).__name__, str(v))))


def _couplings(kernel: str, names: Sequence[str]) -> tuple | None:
    """Knob pairs coupled by a constraint of the kernel's knobs file, from the
    constraints that only name recorded knobs (the template may have grown knobs since
    the recording). None (every pair counts as coupled) when no constraint applies."""
    try:
        spec = load_knob_spec(kernel)
    except KnobError:
        return None
    recorded = set(names)
    usable = []
    for text in spec.constraints:
        used = {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}
        if used <= recorded:
            usable.append(text)
    if not usable:
        return None
    return Space(knobs={n: (0,) for n in names}, constraints=usable).coupled


class ReplayEvaluator:
    """evaluate(point) -> recorded median_s (None: recorded as failed). See module doc.

    Attributes: space (the recorded points as a Space), best (the best ok Measurement),
    measurements (variant_id -> Measurement), calls (how many times it was asked).
    """

    def __init__(self, measurements: Sequence[Measurement], kernel: str, problem: str,
                 where: str, missing: str = "error"):
        if missing not in ("error", "fail"):
            raise ValueError(f"missing must be 'error' or 'fail', got {missing!r}")
        if not measurements:
            raise ReplayError(f"{where}: no measurements of kernel {kernel!r} problem {problem!r}")
        self.kernel, self.problem, self.where, self.missing = kernel, problem, where, missing
        names = sorted(measurements[0].knobs)
        self.measurements: dict[str, Measurement] = {}
        for m in measurements:            # oldest first: a re-measurement replaces
            if sorted(m.knobs) != names:
                raise ReplayError(f"{where}: {kernel}/{problem} mixes knob sets {names} and "
                                  f"{sorted(m.knobs)}; replay one template version at a time")
            self.measurements[variant_id(m.knobs)] = m
        values = {n: _sort_values({canonical_json(m.knobs[n]): m.knobs[n]
                                   for m in self.measurements.values()}.values()) for n in names}
        recorded = set(self.measurements)

        def recorded_point(p, _recorded=recorded):
            return variant_id(p) in _recorded

        self.space = Space(knobs=values, constraints=(recorded_point,), name=f"{kernel} (replayed)",
                           couplings=_couplings(kernel, names))
        ok = [m for m in self.measurements.values() if m.ok]
        self.best = min(ok, key=lambda m: m.median_s) if ok else None
        self.calls = 0

    def __call__(self, point: Mapping[str, Any]) -> float | None:
        self.calls += 1
        m = self.measurements.get(variant_id(point))
        if m is None:
            if self.missing == "fail":
                return None
            raise ReplayMissing(f"{self.where}: point {variant_id(point)} of {self.kernel}/"
                                f"{self.problem} was not recorded; replay needs a store "
                                f"recorded by an exhaustive run over the same space")
        return m.median_s if m.ok else None

    def costs(self) -> list[float]:
        return sorted(m.median_s for m in self.measurements.values() if m.ok)


def replay_evaluator(store_or_path: Store | str | os.PathLike, kernel: str, problem: str, *,
                     host_id: str | None = None, missing: str = "error") -> ReplayEvaluator:
    """An evaluate() answering from the store's recorded measurements of kernel/problem.

    host_id: required when the store holds this kernel/problem from several hosts
    (a merged store); measurements of one host are then replayed. When a variant was
    measured more than once (e.g. under two compilers) the latest row counts.
    """
    store, owned = _open(store_or_path)
    try:
        rows = store.query(kernel=kernel, problem=problem, host_id=host_id)
        hosts = sorted({m.host_id for m in rows})
        if host_id is None and len(hosts) > 1:
            raise ReplayError(f"{store.path}: {kernel}/{problem} was recorded on several hosts "
                              f"{hosts}; pick one with host_id")
        if not rows:
            known = ", ".join(f"{k}/{p}" for k, p in store.problems()) or "none"
            raise ReplayError(f"{store.path}: no measurements of kernel {kernel!r} problem "
                              f"{problem!r}{' host ' + host_id if host_id else ''} "
                              f"(recorded: {known})")
        return ReplayEvaluator(rows, kernel, problem, str(store.path), missing)
    finally:
        if owned:
            store.close()


# ---------------------------------------------------------------- comparing strategies

@dataclass(frozen=True)
class ReplayRun:
    strategy: str
    seed: int
    budget: int | None
    evaluations: int            # distinct evaluations used
    best_cost: float | None
    ratio: float | None         # best_cost / exhaustive best
    evals_to_target: int | None  # evaluations until within tolerance (None: never)
    stop_reason: str

    @property
    def reached(self) -> bool:
        return self.evals_to_target is not None


@dataclass
class ReplayReport:
    store: str
    kernel: str
    problem: str
    space_size: int
    failed_points: int
    best_cost: float
    best_variant: str
    tolerance: float
    near_points: int            # points within tolerance of the best (the easier, the more)
    runs: list[ReplayRun] = field(default_factory=list)

    @property
    def target(self) -> float:
        return self.best_cost * (1 + self.tolerance)

    def summary(self) -> list[dict[str, Any]]:
        """Per strategy: runs, reached, budget, min/median/max evaluations to the target."""
        out = []
        for name in dict.fromkeys(r.strategy for r in self.runs):
            runs = [r for r in self.runs if r.strategy == name]
            hits = [r.evals_to_target for r in runs if r.reached]
            budgets = sorted({r.budget for r in runs}, key=lambda b: (b is None, b or 0))
            out.append({
                "strategy": name, "runs": len(runs), "reached": len(hits),
                "budget": budgets[0] if len(budgets) == 1 else budgets,
                "min": min(hits) if hits else None,
                "median": statistics.median(hits) if hits else None,
                "max": max(hits) if hits else None,
                "worst_ratio": max((r.ratio for r in runs if r.ratio is not None), default=None),
            })
        return out

    def format(self) -> str:
        head = (f"replay {self.kernel} / {self.problem}  ({os.path.basename(self.store)})\n"
                f"  space {self.space_size} points ({self.failed_points} failed), best "
                f"{self.best_cost * 1e6:.1f} us [{self.best_variant}], "
                f"{self.near_points} points within {self.tolerance:.0%}")
        rows = [("strategy", "budget", "reached", "evals to within "
                 f"{self.tolerance:.0%}: min / median / max", "worst best/best")]
        for s in self.summary():
            evals = ("-" if s["min"] is None else
                     f"{s['min']} / {s['median']:g} / {s['max']}")
            rows.append((s["strategy"], str(s["budget"]), f"{s['reached']}/{s['runs']}", evals,
                         "-" if s["worst_ratio"] is None else f"{s['worst_ratio']:.3f}"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  " + "  ".join("-" * w for w in widths))
        return head + "\n" + "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _budget_for(budgets, strategy: str, space_size: int) -> Budget:
    if isinstance(budgets, Mapping):
        if strategy not in budgets:
            raise ValueError(f"no budget given for strategy {strategy!r}")
        b = budgets[strategy]
    else:
        b = budgets
    if isinstance(b, float) and 0 < b <= 1:        # a fraction of the space
        return Budget(max_evals=max(1, round(b * space_size)))
    return Budget.of(b)


def compare_strategies(store_path: Store | str | os.PathLike, kernel: str, problem: str,
                       strategies: Sequence[str], budgets, seeds: Iterable[int], *,
                       tolerance: float = DEFAULT_TOLERANCE, host_id: str | None = None,
                       options: Mapping[str, Mapping[str, Any]] | None = None) -> ReplayReport:
    """Replay each strategy once per seed; report how soon each got within `tolerance`.

    budgets: one budget for all strategies or a mapping strategy -> budget; a budget is
    a Budget, an int (evaluations) or a float in (0, 1] (that fraction of the space).
    options: strategy -> extra keyword options for its search().
    The target is the best recorded ok cost (the exhaustive best) x (1 + tolerance).
    """
    evaluate = replay_evaluator(store_path, kernel, problem, host_id=host_id)
    space = evaluate.space
    if evaluate.best is None:
        raise ReplayError(f"{evaluate.where}: no successful measurement of {kernel}/{problem}")
    best = evaluate.best.median_s
    target = best * (1 + tolerance)
    report = ReplayReport(
        store=str(evaluate.where), kernel=kernel, problem=problem, space_size=space.size(),
        failed_points=sum(1 for m in evaluate.measurements.values() if not m.ok),
        best_cost=best, tolerance=tolerance,
        best_variant=variant_id({k: v for k, v in evaluate.best.knobs.items()
                                 if len(space.knobs[k]) > 1}),   # the knobs searched
        near_points=sum(1 for c in evaluate.costs() if c <= target))
    seeds = list(seeds)
    for name in strategies:
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})")
        budget = _budget_for(budgets, name, space.size())
        for seed in seeds:
            result = STRATEGIES[name].search(space, evaluate, budget, rng=make_rng(seed),
                                             **dict((options or {}).get(name, {})))
            report.runs.append(ReplayRun(
                strategy=name, seed=seed, budget=budget.max_evals, evaluations=result.evaluations,
                best_cost=result.best_cost,
                ratio=None if result.best_cost is None else result.best_cost / best,
                evals_to_target=result.evaluations_to_reach(target),
                stop_reason=result.stop_reason))
    return report


# ---------------------------------------------------------------- CLI

def _seeds(text: str) -> list[int]:
    if text.isdigit():
        return list(range(int(text)))
    out = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += list(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = _cli.Parser(
        prog="python -m tuner replay",
        description="Replay search strategies against a recorded results store and report "
                    "how many evaluations each needs to get within a tolerance of the "
                    "exhaustive best.")
    p.add_argument("store", help="results store (.sqlite) recorded by an exhaustive run")
    p.add_argument("--kernel", help="kernel (template) name; default: every one recorded")
    p.add_argument("--problem", help="problem name; default: every one recorded for the kernel")
    p.add_argument("--host-id", help="host to replay when the store holds several")
    p.add_argument("--strategies", default="random,annealing,tpe",
                   help="comma-separated strategies (default: %(default)s; known: "
                        + ", ".join(STRATEGIES) + ")")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--budget", type=_cli.positive_int, help="evaluations per run")
    g.add_argument("--budget-fraction", type=_cli.fraction, default=DEFAULT_BUDGET_FRACTION,
                   help="evaluations per run as a fraction of the space (default: %(default)s)")
    p.add_argument("--seeds", default="10",
                   help="N (seeds 0..N-1), or a list such as 0,1,5-9 (default: %(default)s)")
    p.add_argument("--tolerance", type=_cli.non_negative_float, default=DEFAULT_TOLERANCE,
                   help="target: within this fraction of the best (default: %(default)s)")
    p.add_argument("--runs", action="store_true", help="also print every run")
    p.add_argument("--check", action="store_true",
                   help="exit with status 1 unless every run reached the target")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    try:
        with Store(args.store, readonly=True) as store:
            pairs = [(k, p) for k, p in store.problems()
                     if (args.kernel is None or k == args.kernel)
                     and (args.problem is None or p == args.problem)]
            if not pairs:
                known = ", ".join(f"{k}/{p}" for k, p in store.problems()) or "none"
                print(f"replay: nothing recorded for kernel={args.kernel} problem={args.problem} "
                      f"in {args.store} (recorded: {known})", file=sys.stderr)
                return 2
            budget = args.budget if args.budget is not None else args.budget_fraction
            all_reached = True
            for kernel, problem in pairs:
                report = compare_strategies(store, kernel, problem, strategies, budget,
                                            _seeds(args.seeds), tolerance=args.tolerance,
                                            host_id=args.host_id)
                print(report.format())
                if args.runs:
                    for r in report.runs:
                        print(f"    {r.strategy:<11} seed {r.seed:<3} evals {r.evaluations:<4} "
                              f"to target {r.evals_to_target}  best/best "
                              f"{'-' if r.ratio is None else f'{r.ratio:.3f}'}  ({r.stop_reason})")
                print()
                all_reached &= all(r.reached for r in report.runs)
    except (ReplayError, StoreError, ValueError, OSError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    return 1 if args.check and not all_reached else 0


if __name__ == "__main__":
    sys.exit(main())
