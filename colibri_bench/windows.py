"""A timed round's share of the read bandwidth, paired with the readings around it.

On a shared machine the memory moves between slow and fast windows within seconds (the
2-vCPU Zen 4 VM: about 30-35 and 55-62 GB/s at 2 threads), so a bandwidth read at the start
of a run misjudges the rounds that ran in the other window. Round r's GB/s is set against
the better of reading r (right before it) and reading r + 1 (right after it); the rounds
whose two readings were both at least FAST of the run's best reading ran in a fast window,
those whose readings were both under SLOW of it in a slow one. Used by `ab` and `e2e`."""
from __future__ import annotations

from tuner.decide import _median

FAST, SLOW = 0.8, 0.7


def summary(gbps: list, readings: list, best: float | None = None) -> dict | None:
    """{all, fast, slow: the median share of the read bandwidth (None without such rounds),
    fast_rounds, slow_rounds, best_gbps, moved: whether a reading fell under FAST of the best}
    of rounds whose GB/s are `gbps` and whose readings are `readings` (one more than the
    rounds: each round's before, then the last one's after; None where not measured). `best`:
    the reading the windows are judged against, the best of a longer run (default: of these
    readings; a run that never left the slow window would call it fast)."""
    return summary_of_pairs(gbps, list(zip(readings, readings[1:])), best)


def summary_of_pairs(gbps: list, around: list, best: float | None = None) -> dict | None:
    """summary's answer where each round has readings of its own: around[r] = (the reading
    right before round r, the one right after)."""
    pairs = [(g, min(r0, r1), max(r0, r1)) for g, (r0, r1) in zip(gbps, around) if g and r0 and r1]
    if not pairs:
        return None
    best = max([hi for _, _, hi in pairs] + ([best] if best else []))
    return {"all": _median([g / hi for g, _, hi in pairs]), "best_gbps": best,
            "moved": min(lo for _, lo, _ in pairs) < FAST * best,
            **_apart([(g / hi, lo, hi) for g, lo, hi in pairs], best)}


def values_by_window(values: list, readings: list, best: float) -> dict:
    """{fast, slow: the median of `values` (one per round, such as A/B speed ratios) over the
    rounds of each window (None without such rounds), fast_rounds, slow_rounds}; readings as
    summary's, the windows judged against `best`."""
    return _apart([(v, min(r0, r1), max(r0, r1)) for v, r0, r1 in zip(values, readings, readings[1:])
                   if v is not None and r0 and r1], best)


def _apart(rounds: list, best: float) -> dict:
    """The medians of the values of (value, lower reading, higher reading) rounds in fast and
    in slow windows of the best reading `best`, with their counts."""
    fast = [v for v, lo, _ in rounds if lo >= FAST * best]
    slow = [v for v, _, hi in rounds if hi < SLOW * best]
    return {"fast": _median(fast) if fast else None, "fast_rounds": len(fast),
            "slow": _median(slow) if slow else None, "slow_rounds": len(slow)}


def text(win: dict | None) -> str:
    """The fast and slow windows' shares for a table ('' without rounds)."""
    if not win:
        return ""
    part = lambda k: f"{100 * win[k]:.0f}% (n={win[k + '_rounds']})" if win[k] is not None else "- (n=0)"
    return f"fast {part('fast')}, slow {part('slow')}"
