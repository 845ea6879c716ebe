"""Random search: distinct points drawn uniformly without replacement.

search(space, evaluate, budget, *, rng, start=None) -> Result

The start points come first, then a random permutation (from `rng`) of the other
points, so no point is measured twice and a run with every evaluation allowed ends up
exhaustive. The planned points are announced to `evaluate.prepare` (if it has one).
A baseline for the model-based strategies: it needs about N / (k + 1) evaluations to
hit one of k good points among N.

Options: none.
"""
from __future__ import annotations

from tuner.search.base import EXHAUSTED, Budget, Result, make_rng, run_strategy

NAME = "random"


def search(space, evaluate, budget: Budget, *, rng=None, start=None) -> Result:
    rng = make_rng(rng)

    def body(ev):
        first = ev.valid_start(start)
        seen = {space.key(p) for p in first}
        rest = [p for p in space.points() if space.key(p) not in seen]
        rng.shuffle(rest)
        order = first + rest
        ev.prepare(order[: ev.remaining()])
        for point in order:
            ev(point)
        return EXHAUSTED

    return run_strategy(NAME, space, evaluate, budget, body)
