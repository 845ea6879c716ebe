"""Model-based search: Optuna's Tree-structured Parzen Estimator (TPE).

search(space, evaluate, budget, *, rng, start=None, seed=None, n_startup=10,
       multivariate=True, ordinal="categorical", patience=3) -> Result

One Optuna trial per proposal, driven with ask/tell (no Optuna storage, no threads).
Each knob is one Optuna distribution:
    ordinal="categorical"  every knob a CategoricalDistribution over its values (default);
    ordinal="index"        numeric knobs an IntDistribution over their value *index*, so
                           TPE's kernels see that prefetch 512 lies between 256 and 1024;
                           categorical knobs (isa) stay categorical.
seed: the TPESampler seed; None draws it from `rng`, so the search is reproducible.
n_startup: random trials before the model is used. multivariate: TPE models the knobs
jointly (helps with interacting knobs like rows x unroll).

What is told to Optuna:
    measured point      COMPLETE with its cost;
    failed variant      COMPLETE with +inf (a compile error or crash is information:
                        TPE learns to avoid that region; it is never chosen: the best
                        point comes from the measured costs, not from Optuna);
    invalid point       FAIL, not counted as an evaluation (a constraint such as
                        rows*tok_block*unroll <= 16 is known, not measured; FAIL keeps
                        these points out of TPE's model rather than teaching it that
                        every large knob is bad);
    repeated point      FAIL, not counted (the cache answers it; telling it again would
                        over-weight it in the model).
After `patience` proposals in a row that were invalid or repeated (TPE has converged
onto measured points), the next trial is enqueued: an unmeasured neighbour of the best
point (one knob or two coupled knobs moved), else a random unmeasured point. Start points are enqueued first.

Optuna's log output and experimental-feature warnings are silenced for the duration
of the search (the previous log level is restored).
"""
from __future__ import annotations

import math
import warnings

from tuner.search.base import BudgetExhausted, Budget, FINISHED, Result, make_rng, run_strategy

NAME = "tpe"
ORDINAL_MODES = ("categorical", "index")


def search(space, evaluate, budget: Budget, *, rng=None, start=None, seed: int | None = None,
           n_startup: int = 10, multivariate: bool = True, ordinal: str = "categorical",
           patience: int = 3) -> Result:
    import optuna  # imported here: it takes a second, and only this strategy needs it

    rng = make_rng(rng)
    if ordinal not in ORDINAL_MODES:
        raise ValueError(f"ordinal must be one of {ORDINAL_MODES}, got {ordinal!r}")
    if seed is None:
        seed = rng.getrandbits(32)
    info = {"seed": seed, "trials": 0, "invalid": 0, "repeated": 0, "enqueued": 0}
    by_index = {k for k in space.knobs if ordinal == "index" and k not in space.categorical}

    def to_params(point):
        return {k: (space.knobs[k].index(point[k]) if k in by_index else point[k]) for k in space.knobs}

    def suggest(trial):
        point = {}
        for k, values in space.knobs.items():
            if k in by_index:
                point[k] = values[trial.suggest_int(k, 0, len(values) - 1)]
            else:
                point[k] = trial.suggest_categorical(k, list(values))
        return point

    def fallback(ev):
        best = ev.best_point
        if best is not None:
            fresh = [p for p in space.neighbours(best) + space.pair_neighbours(best)
                     if not ev.seen(p)]
            if fresh:
                return rng.choice(fresh)
        rest = [p for p in space.points() if not ev.seen(p)]
        return rng.choice(rest) if rest else None

    def body(ev):
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup,
                                             multivariate=multivariate)
        study = optuna.create_study(direction="minimize", sampler=sampler)
        for p in ev.valid_start(start):
            study.enqueue_trial(to_params(p))
            info["enqueued"] += 1
        misses = 0
        max_trials = 20 * space.size() + 1000
        for _ in range(max_trials):
            reason = ev.stop_reason()
            if reason:
                raise BudgetExhausted(reason)
            if misses >= patience:
                p = fallback(ev)
                if p is None:
                    break
                study.enqueue_trial(to_params(p))
                info["enqueued"] += 1
                misses = 0
            trial = study.ask()
            info["trials"] += 1
            point = suggest(trial)
            if not space.contains(point):
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                info["invalid"] += 1
                misses += 1
                continue
            if ev.seen(point):
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                info["repeated"] += 1
                misses += 1
                continue
            cost = ev(point)
            study.tell(trial, math.inf if cost is None else cost)
            misses = 0
        return FINISHED

    logging = optuna.logging
    level = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return run_strategy(NAME, space, evaluate, budget, body, info)
    finally:
        logging.set_verbosity(level)
