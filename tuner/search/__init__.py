"""Search strategies: which variants to measure, in what order, within a budget.

Each strategy is one module with one entry point (Kernel Tuner's layout):

    search(space, evaluate, budget, *, rng, start=None, **options) -> Result

space     tuner.search.space.Space: the valid points.
evaluate  evaluate(point: dict) -> float | None: the cost of a point (seconds; lower is
          better), or None when the variant failed (compile error, crash, timeout,
          wrong answer). A failed point is never chosen. Non-finite costs count as
          failed. May be slow (build + verify + time in a worker).
          Optional: if `evaluate` has a `prepare(points)` attribute, strategies that
          know their next points in advance (exhaustive, random) call it with them
          first, so the caller may compile those variants in a parallel batch.
budget    Budget(max_evals, max_seconds): the search stops before an evaluation that
          would exceed either; None means no limit of that kind.
rng       random.Random (or an int seed): the only source of randomness, so a search
          is reproducible from its seed.
start     points to evaluate first (known good points: the profile default, other
          machines' winners). Points not in the space are skipped.

Evaluations are deduplicated here, not in the strategies: `Evaluations` wraps
`evaluate`, caches each point's cost, counts only distinct evaluations against the
budget and keeps the history in evaluation order. A strategy asking again for a known
point gets the cached cost for free.

Strategies (STRATEGIES): exhaustive, random, annealing, tpe. `choose_default()` picks
one for a space and budget.
"""
from __future__ import annotations

import random

from tuner.search import annealing, exhaustive, random_search, tpe
from tuner.search.base import (DEFAULT_SEARCH, EXHAUSTED, FINISHED, MAX_EVALS, MAX_SECONDS, SMALL_SPACE,
                   Budget, BudgetExhausted, Evaluate, Evaluations, Result, choose_default,
                   make_rng, run_strategy)
from tuner.search.space import Space

__all__ = ["DEFAULT_SEARCH", "EXHAUSTED", "FINISHED", "MAX_EVALS", "MAX_SECONDS", "SMALL_SPACE",
           "STRATEGIES", "Budget", "BudgetExhausted", "Evaluate", "Evaluations", "Result",
           "choose_default", "make_rng", "run_strategy", "search"]

STRATEGIES = {
    "exhaustive": exhaustive,
    "random": random_search,
    "annealing": annealing,
    "tpe": tpe,
}


def search(name: str, space: Space, evaluate: Evaluate, budget: Budget | int | None, *,
           rng: random.Random | int | None = None, start=None, **options) -> Result:
    """Run the strategy called `name` (a key of STRATEGIES)."""
    try:
        module = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown search strategy {name!r} (known: {', '.join(STRATEGIES)})") from None
    return module.search(space, evaluate, Budget.of(budget), rng=make_rng(rng), start=start, **options)
