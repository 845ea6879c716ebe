"""What every search strategy shares: budgets, results, the deduplicating Evaluations
wrapper, run_strategy() and choose_default() (see the package docstring)."""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from tuner.search.space import Space

Point = dict
Evaluate = Callable[[Point], "float | None"]

# Stop reasons of a Result.
MAX_EVALS = "max_evals"         # the evaluation budget is used up
MAX_SECONDS = "max_seconds"     # the time budget is used up
EXHAUSTED = "exhausted"         # every point of the space has been evaluated
FINISHED = "finished"           # the strategy ended on its own (e.g. no progress left)

# A space this small is searched exhaustively even under a time budget alone.
SMALL_SPACE = 64


@dataclass(frozen=True)
class Budget:
    """Limits of one search: distinct evaluations and/or wall seconds (None: no limit)."""
    max_evals: int | None = None
    max_seconds: float | None = None

    def __post_init__(self):
        if self.max_evals is not None and (not isinstance(self.max_evals, int) or self.max_evals < 0):
            raise ValueError(f"Budget.max_evals must be a non-negative int or None, got {self.max_evals!r}")
        if self.max_seconds is not None and not (self.max_seconds >= 0):
            raise ValueError(f"Budget.max_seconds must be >= 0 or None, got {self.max_seconds!r}")

    @classmethod
    def of(cls, value: "Budget | int | None") -> "Budget":
        """Budget from a Budget, an evaluation count, or None (unlimited)."""
        if isinstance(value, Budget):
            return value
        if value is None:
            return cls()
        if isinstance(value, int):
            return cls(max_evals=value)
        raise TypeError(f"budget must be a Budget, an int or None, got {value!r}")


@dataclass
class Result:
    """What a search found and how.

    best_point/best_cost: the lowest-cost successful point (None if none succeeded).
    history: (point, cost) per distinct evaluation, in evaluation order (cost None:
    failed). evaluations: len(history). stop_reason: max_evals | max_seconds |
    exhausted | finished. seconds: wall time of the search.
    """
    strategy: str
    best_point: dict | None
    best_cost: float | None
    history: list[tuple[dict, float | None]]
    evaluations: int
    stop_reason: str
    seconds: float
    info: dict = field(default_factory=dict)

    def evaluations_to_reach(self, cost: float) -> int | None:
        """1-based count of evaluations after which a cost <= `cost` had been seen."""
        for i, (_, c) in enumerate(self.history, 1):
            if c is not None and c <= cost:
                return i
        return None

    def best_curve(self) -> list[float | None]:
        """Best cost known after each evaluation."""
        best, out = None, []
        for _, c in self.history:
            if c is not None and (best is None or c < best):
                best = c
            out.append(best)
        return out


class BudgetExhausted(Exception):
    """Raised by Evaluations when a new evaluation would exceed the budget."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Evaluations:
    """The deduplicating, budget-keeping wrapper every strategy evaluates through.

    ev(point) -> cost | None. A point seen before costs nothing. Before a new point is
    evaluated the budget is checked; if it is spent, BudgetExhausted is raised (the
    strategy lets it propagate; run_strategy() turns it into the Result's stop reason).
    """

    def __init__(self, space: Space, evaluate: Evaluate, budget: Budget,
                 clock: Callable[[], float] = time.monotonic):
        self.space = space
        self._evaluate = evaluate
        self.budget = budget
        self.clock = clock
        self.started = clock()
        self.cache: dict[tuple, float | None] = {}
        self.history: list[tuple[dict, float | None]] = []
        self.best_point: dict | None = None
        self.best_cost: float | None = None

    # -- budget
    @property
    def used(self) -> int:
        return len(self.history)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def stop_reason(self) -> str | None:
        """Why no further new evaluation may start, or None if one may."""
        if self.used >= self.space.size():
            return EXHAUSTED
        if self.budget.max_evals is not None and self.used >= self.budget.max_evals:
            return MAX_EVALS
        if self.budget.max_seconds is not None and self.elapsed() >= self.budget.max_seconds:
            return MAX_SECONDS
        return None

    def remaining(self) -> int:
        """New evaluations still allowed by max_evals and the space (ignores time)."""
        left = self.space.size() - self.used
        if self.budget.max_evals is not None:
            left = min(left, self.budget.max_evals - self.used)
        return max(left, 0)

    # -- evaluation
    def seen(self, point: Mapping[str, Any]) -> bool:
        return self.space.key(point) in self.cache

    def cached(self, point: Mapping[str, Any]) -> float | None:
        return self.cache[self.space.key(point)]

    def __call__(self, point: Mapping[str, Any]) -> float | None:
        key = self.space.key(point)
        if key in self.cache:
            return self.cache[key]
        if not self.space.contains(point):
            raise ValueError(f"strategy asked for a point outside the space: {self.space.why_not(point)}")
        reason = self.stop_reason()
        if reason:
            raise BudgetExhausted(reason)
        point = self.space.normalise(point)
        cost = self._evaluate(dict(point))
        if cost is not None:
            try:
                cost = float(cost)
            except (TypeError, ValueError):
                raise TypeError(f"evaluate() must return a number or None, got {cost!r}") from None
            if not math.isfinite(cost):
                cost = None
        self.cache[key] = cost
        self.history.append((point, cost))
        if cost is not None and (self.best_cost is None or cost < self.best_cost):
            self.best_point, self.best_cost = point, cost
        return cost

    def prepare(self, points: Iterable[Mapping[str, Any]]) -> None:
        """Tell the evaluator which new points come next (see module doc), if it wants to know."""
        hook = getattr(self._evaluate, "prepare", None)
        if hook is None:
            return
        new = [self.space.normalise(p) for p in points if not self.seen(p)]
        if new:
            hook(new)

    def valid_start(self, start: Iterable[Mapping[str, Any]] | None) -> list[dict]:
        """The start points that are points of the space, deduplicated, in order."""
        out, keys = [], set()
        for p in start or ():
            if isinstance(p, Mapping) and self.space.contains(p):
                k = self.space.key(p)
                if k not in keys:
                    keys.add(k)
                    out.append(self.space.normalise(p))
        return out


DEFAULT_SEARCH = "annealing"


def make_rng(rng: random.Random | int | None) -> random.Random:
    if isinstance(rng, random.Random):
        return rng
    if rng is None or isinstance(rng, int):
        return random.Random(rng if rng is not None else 0)
    raise TypeError(f"rng must be a random.Random or an int seed, got {rng!r}")


def run_strategy(name: str, space: Space, evaluate: Evaluate, budget: Budget | int | None,
                 body: Callable[[Evaluations], "str | None"], info: dict | None = None) -> Result:
    """Run a strategy body over an Evaluations wrapper and package the Result.

    body(ev) returns its own stop reason (or None for FINISHED) when it ends by itself;
    BudgetExhausted raised from inside it becomes the stop reason.
    """
    budget = Budget.of(budget)
    ev = evaluate if isinstance(evaluate, Evaluations) else Evaluations(space, evaluate, budget)
    try:
        reason = body(ev) or FINISHED
    except BudgetExhausted as exc:
        reason = exc.reason
    if reason == FINISHED and ev.used >= space.size():
        reason = EXHAUSTED
    return Result(strategy=name, best_point=dict(ev.best_point) if ev.best_point else None,
                  best_cost=ev.best_cost, history=list(ev.history), evaluations=ev.used,
                  stop_reason=reason, seconds=ev.elapsed(), info=dict(info or {}))


def choose_default(space: Space, budget: Budget | int | None) -> str:
    """The strategy `python -m tuner run` uses when none is named.

    exhaustive  when the budget covers the whole space (space.size() <= max_evals), when
                there is no budget at all, or when only a time budget is set and the
                space is small (<= SMALL_SPACE points);
    annealing   otherwise. In replay (tests/tuner/test_replay.py) annealing and TPE did alike:
                on the synthetic expert_ffn store, a third of the space sufficed for
                both in every run (200 seeds for annealing); on the recorded store of
                a noisy 2-vCPU VM both needed about half the space, annealing a median
                of 37 evaluations to TPE's 46. Annealing needs no model, costs nothing
                per proposal and does not import optuna.
    """
    budget = Budget.of(budget)
    n = space.size()
    if budget.max_evals is not None:
        return "exhaustive" if n <= budget.max_evals else DEFAULT_SEARCH
    if budget.max_seconds is None or n <= SMALL_SPACE:
        return "exhaustive"
    return DEFAULT_SEARCH
