"""Interleaved timing of functions of no arguments in one process: the routine behind
colibri.hf's hand-off measurement and `python -m colibri_bench overhead`. (Libraries in
worker children are the tuner's tuner/measure/interleave.py.)

Each round times every function once, in an order that starts one later each round, so a
slow patch of the machine falls on all of them alike; a function's figure for the round is
the median seconds of `calls` calls, after calls // 10 untimed ones (at least one)."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Hashable, Mapping


def time_calls(fn: Callable[[], object], calls: int) -> float:
    """Median seconds of one call of fn over `calls` calls, after calls // 10 untimed ones."""
    for _ in range(max(1, calls // 10)):
        fn()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def interleaved(fns: Mapping[Hashable, Callable[[], object]], rounds: int, calls: int = 1) -> dict:
    """{key: [seconds per call, one per round]} of every function in fns, in rounds that each
    start one function later."""
    keys = list(fns)
    per = {k: [] for k in keys}
    for r in range(rounds):
        s = r % len(keys) if keys else 0
        for k in keys[s:] + keys[:s]:
            per[k].append(time_calls(fns[k], calls))
    return per
