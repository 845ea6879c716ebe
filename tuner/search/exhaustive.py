"""Exhaustive search: every point of the space, in the space's order.

search(space, evaluate, budget, *, rng, start=None) -> Result

The start points come first (so a cut-short run has at least measured the known good
points), then every other point in `space.points()` order. The planned points are
announced to `evaluate.prepare` (if it has one) up front, so the caller can compile
them in parallel batches. Stops at the budget or when the space is exhausted; `rng` is
unused (the order is fixed) but accepted like every strategy's.

Options: none.
"""
from __future__ import annotations

from tuner.search.base import EXHAUSTED, Budget, Result, make_rng, run_strategy

NAME = "exhaustive"


def search(space, evaluate, budget: Budget, *, rng=None, start=None) -> Result:
    make_rng(rng)  # type check only

    def body(ev):
        first = ev.valid_start(start)
        seen = {space.key(p) for p in first}
        order = first + [p for p in space.points() if space.key(p) not in seen]
        ev.prepare(order[: ev.remaining()])
        for point in order:
            ev(point)
        return EXHAUSTED

    return run_strategy(NAME, space, evaluate, budget, body)
