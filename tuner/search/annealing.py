"""Simulated annealing over the space's neighbourhood, with restarts.

search(space, evaluate, budget, *, rng, start=None, t0=0.05, cooling=0.93,
       t_min=0.002, pair_moves=0.5, restart_from="alternate", max_steps=None) -> Result

A chain walks from point to point; each step proposes one random neighbour of the
current point (space.neighbours: one knob moved to an adjacent value, or any other
value of a categorical knob such as isa) and moves there with the Metropolis rule on
the *relative* cost change, so the schedule does not depend on the cost's unit:

    delta = (cost(new) - cost(current)) / cost(current)
    accept if delta <= 0, else with probability exp(-delta / T)

A failed neighbour (cost None) is never accepted.

Pair moves: with probability `pair_moves` the proposal changes two coupled knobs at
once (space.pair_neighbours: knobs that share a constraint). Register-tile
constraints (rows * tok_block * unroll <= 16) make ridges that one-knob steps cannot
cross downhill: from rows=2, tok_block=4, unroll=2 at the limit, rows=4 is invalid
and unroll=1 alone is 17% slower, while rows=4 with unroll=1 is the best tile. In
replay on the synthetic prefill class (115 points, budget 40, 200 seeds) pair_moves=0
reached within 5% of the best in 46% of the runs, 0.5 in 99.5-100%.

Temperature schedule (geometric, per proposal): T_k = t0 * cooling**k. With the
defaults, a move 5% worse is accepted with probability 1/e at the start of a chain,
and the chain ends after ~45 proposals, when T < t_min (a 1% worse move then has
probability ~0.7%). Proposals of already-measured points cost no evaluation (the
shared cache answers them) but still cool the chain, so a chain stuck in a fully
measured basin ends quickly.

Restarts: when a chain ends, a new one starts at T = t0 from
    restart_from="best"       the best point so far (intensify; a random unmeasured
                              point instead once all its neighbours are measured),
    restart_from="random"     a random point not yet measured (diversify),
    restart_from="alternate"  random, best, random, ... (default).
The first chain starts from the best of the `start` points when given, else from a
random point (pass start=[space.default] to begin at the profile's default).

Stops at the budget, when every point has been measured, or after `max_steps`
proposals in all (default 50 x space size: a guard for unlimited budgets).
"""
from __future__ import annotations

import math

from tuner.search.base import EXHAUSTED, FINISHED, Budget, Result, make_rng, run_strategy

NAME = "annealing"
RESTARTS = ("alternate", "best", "random")


def search(space, evaluate, budget: Budget, *, rng=None, start=None, t0: float = 0.05,
           cooling: float = 0.93, t_min: float = 0.002, pair_moves: float = 0.5,
           restart_from: str = "alternate",
           max_steps: int | None = None) -> Result:
    rng = make_rng(rng)
    if not (t0 > 0 and 0 < cooling < 1 and 0 < t_min < t0):
        raise ValueError(f"annealing needs t0 > t_min > 0 and 0 < cooling < 1 "
                         f"(t0={t0}, t_min={t_min}, cooling={cooling})")
    if not 0 <= pair_moves <= 1:
        raise ValueError(f"pair_moves is a probability, got {pair_moves}")
    if restart_from not in RESTARTS:
        raise ValueError(f"restart_from must be one of {RESTARTS}, got {restart_from!r}")
    max_steps = max_steps if max_steps is not None else 50 * max(space.size(), 1)
    info = {"chains": 0, "accepted": 0, "steps": 0}

    def fresh_point(ev):
        """A random point not measured yet (None when all are)."""
        for _ in range(64):
            p = space.random_point(rng)
            if not ev.seen(p):
                return p
        rest = [p for p in space.points() if not ev.seen(p)]
        return rng.choice(rest) if rest else None

    def body(ev):
        current, current_cost = None, None
        for p in ev.valid_start(start):
            c = ev(p)
            if c is not None and (current_cost is None or c < current_cost):
                current, current_cost = p, c
        chain = 0
        steps = 0
        while steps < max_steps:
            # ---- start a chain
            if chain > 0 or current is None:
                use_best = (restart_from == "best"
                            or (restart_from == "alternate" and chain % 2 == 0 and chain > 0))
                if (use_best and ev.best_point is not None
                        and any(not ev.seen(q) for q in space.neighbours(ev.best_point))):
                    current = ev.best_point
                else:
                    current = fresh_point(ev)
                    if current is None:
                        return EXHAUSTED
                current_cost = ev(current)
            chain += 1
            info["chains"] = chain
            # a failed start point: walk from it anyway (any successful neighbour is better)
            temperature = t0
            while temperature >= t_min and steps < max_steps:
                steps += 1
                info["steps"] = steps
                nbrs = space.pair_neighbours(current) if rng.random() < pair_moves else []
                nbrs = nbrs or space.neighbours(current)
                if not nbrs:
                    break
                cand = rng.choice(nbrs)
                cost = ev(cand)
                temperature *= cooling
                if cost is None:
                    continue
                if current_cost is None or cost <= current_cost:
                    accept = True
                else:
                    delta = (cost - current_cost) / current_cost
                    accept = rng.random() < math.exp(-delta / max(temperature, 1e-12))
                if accept:
                    current, current_cost = cand, cost
                    info["accepted"] += 1
        return FINISHED

    return run_strategy(NAME, space, evaluate, budget, body, info)
