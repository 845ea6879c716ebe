"""Interleaved timing of several libraries: the one routine behind every A/B comparison of
the tuner (a class's race, the acceptance gate, `tuner check`, the storage class's race).

A *round* times every live library once on every problem and thread count, in rotating
order, inside one worker child that keeps their layers loaded (worker.Session); the
statistics of rounds live in tuner/decide.py. `interleave()` runs rounds until a stop rule
says so (run_rounds, which any session with a round() runs: tuner/storage.py's times
runtime settings instead of libraries; race_rule is the races' stop rule):

    res = interleave(libs, problems, threads=[2], weights_dir=..., rounds=(3, 8),
                     step=my_rule)        # step(res) -> the libraries to keep timing
    res.seconds[(problem, threads)][lib]  # that library's seconds per call, one per round

With step=None it runs rounds[1] rounds (a fixed comparison). From round rounds[0] on,
step decides after each round; it returns the libraries to keep, or None when the
comparison is settled. A step that keeps fewer than two libraries, None, the maximum of
rounds, or budget_s (seconds of rounds, counted once the libraries are loaded and checked)
stops it.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from tuner.measure import weights, worker


@dataclass
class Interleaved:
    libs: list[str]
    cells: list[tuple[str, int]]                 # (problem name, threads), in timing order
    seconds: dict = field(default_factory=dict)  # cell -> [[seconds per round] per library]
    verified: list = field(default_factory=list)  # per library: None or the verification's fields
    live: list[int] = field(default_factory=list)  # the libraries still timed at the end
    dropped: dict = field(default_factory=dict)   # library -> the round after which it was dropped
    rounds: int = 0
    bandwidth: dict = field(default_factory=dict)  # threads -> read GB/s per round (asked for)
    status: str = worker.STATUS_OK
    reason: str = ""
    wall_s: float = 0.0
    ready_s: float = 0.0  # of wall_s, the model files, loading every library and checking them

    def read_bandwidth(self, threads: int) -> float | None:
        """The median read bandwidth of the rounds at `threads` (None if not measured)."""
        from tuner.decide import _median

        v = self.bandwidth.get(threads)
        return _median(v) if v else None

    def rows(self, lib: int) -> list[list[float]]:
        """Library `lib`'s rounds per cell, cells in order: [cell][round]."""
        return [self.seconds[c][lib] for c in self.cells]

    def common(self, libs: Sequence[int]) -> list[list[list[float]]]:
        """[lib][cell][round] over the rounds every one of `libs` was timed in."""
        n = min(len(self.seconds[c][i]) for c in self.cells for i in libs) if self.cells else 0
        return [[self.seconds[c][i][:n] for c in self.cells] for i in libs]

    @property
    def ok(self) -> bool:
        return self.status == worker.STATUS_OK


def prepare(problems, weights_dir: str | Path, seed: int = 0, progress=None) -> None:
    """Make the model files every library of a comparison maps (once per shape and dtype)."""
    from tuner.host.bandwidth import _llc_total_here, copies_for

    llc = _llc_total_here()
    todo = list({(p.shape, p.dtype): p for p in problems}.values())
    for p in {p.shape: p for p in todo}.values():  # each shape's f32 weights, once
        weights.ensure_f32(weights_dir, p, seed, progress)
    # the dtypes' files side by side: encoding, checksums and writes release the GIL
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
        list(pool.map(lambda p: weights.ensure_model(weights_dir, p, seed, copies_for(p, llc), progress),
                      todo))


def interleave(libs: Sequence[str | Path], problems, *, threads: Sequence[int], weights_dir,
               seed: int = 0, rounds: tuple[int, int] = (4, 4), min_seconds: float = 0.2,
               warmup: int = 1, verify: Sequence[bool] | None = None,
               step: Callable[["Interleaved"], Sequence[int]] | None = None,
               budget_s: float | None = None, timeout_s: float = 300.0, bandwidth: bool = False,
               say=None) -> Interleaved:
    """Time `libs` on `problems` x `threads` in interleaved rounds (module docstring)."""
    t0 = time.monotonic()
    problems = list(problems)
    prepare(problems, weights_dir, seed, say)
    res = Interleaved(libs=[str(x) for x in libs],
                      cells=[(p.name, th) for p in problems for th in threads])
    res.seconds = {c: [[] for _ in libs] for c in res.cells}
    res.live = list(range(len(libs)))
    try:
        with worker.Session(libs, problems, threads=threads, weights_dir=weights_dir, seed=seed,
                            min_seconds=min_seconds, warmup=warmup, verify=verify,
                            timeout_s=timeout_s, bandwidth=bandwidth) as s:
            res.verified = list(s.verified)
            res.live = [i for i in res.live if not _failed(res.verified[i])]
            res.ready_s = time.monotonic() - t0  # the budget is for rounds, not for loading and checking
            run_rounds(s, res, rounds=rounds, step=step, budget_s=budget_s)
    except worker.SessionError as exc:
        res.status, res.reason = exc.status, exc.reason
    res.wall_s = time.monotonic() - t0
    return res


def run_rounds(session, res: Interleaved, *, rounds: tuple[int, int], step=None,
               budget_s: float | None = None) -> Interleaved:
    """Rounds of session.round(live) -> {cell: [seconds or None per library]} into res until
    the stop rules of interleave() end them. session.bandwidth (optional): {threads: [read
    GB/s per round]}."""
    t_ready = time.monotonic()
    lo, hi = rounds
    for r in range(hi):
        if len(res.live) < 2 and len(res.libs) > 1:
            break
        got = session.round(res.live)
        for c, row in got.items():
            for i, v in enumerate(row):
                if v is not None:
                    res.seconds[c][i].append(v)
        res.rounds = r + 1
        res.bandwidth = {th: list(v) for th, v in getattr(session, "bandwidth", {}).items()}
        if budget_s is not None and time.monotonic() - t_ready > budget_s and res.rounds >= 2:
            break
        if step is not None and res.rounds >= lo:
            chosen = step(res)
            if chosen is None:
                break
            keep = [i for i in chosen if i in res.live]
            for i in res.live:
                if i not in keep:
                    res.dropped[i] = res.rounds
            res.live = keep
            if len(keep) < 2:
                break
    return res


def race_rule(default: int, names: Sequence[str]) -> Callable[[Interleaved], list[int] | None]:
    """The stop rule of a race of candidates against library `default` on the cells named
    `names` (decide.race_step): None once no verdict is open, else the default and the
    candidates still worth timing."""
    from tuner import decide

    def step(res: Interleaved):
        live = [i for i in res.live if i != default]
        rows = res.common([default, *live])
        status = decide.race_step(rows[0], dict(zip(live, rows[1:])), names)
        if not any(s == "open" for s in status.values()):
            return None
        return [default] + [i for i in live if status[i] in ("open", "faster")]
    return step


def _failed(v) -> bool:
    return v is not None and v.get("status") != worker.STATUS_OK
