"""When a measured speed-up counts: ratios of interleaved rounds, their 95% interval, and
the two rules built on them (docs/tuning.md, "How the tuner decides").

A *round* times the default and a candidate back to back (in rotating order), so a drift
of the machine moves both; a round's speed ratio is default seconds / candidate seconds
(> 1: the candidate is faster). Over several problems, a round's ratio is the geometric
mean of the problems' ratios in that round.

- adopt: a candidate replaces the default only when the lower bound of the 95% interval
  of its ratio is > 1.0, and no problem of its class is slower (below).
- slower: a cell is slower beyond noise when the upper bound of its interval is < 1.0 or
  its median ratio is < SLOWER_MEDIAN.

The interval is Student's t interval of the mean log ratio over rounds, exponentiated: it
widens with the spread of the rounds and, through t, with how few they are (3 rounds:
4.3 standard errors each side). A bootstrap of so few rounds would claim more than they
hold: with 3 rounds its interval is about [min, max], which pure noise puts below 1 one
time in eight. With one round there is no interval, and nothing is faster or slower
than its median says. A tie keeps the default.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

SLOWER_MEDIAN = 0.98
CONFIDENCE = 0.95
# two-sided 95% quantiles of Student's t by degrees of freedom; beyond the table
# 1.96 + 2.5/df is within 0.002 of the exact value
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    return _T95[df - 1] if df <= len(_T95) else 1.96 + 2.5 / df


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass(frozen=True)
class Ratio:
    """A speed ratio over rounds: its median and 95% interval."""
    median: float
    lo: float
    hi: float
    rounds: int

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        return f"{self.median:.3f}x [{self.lo:.3f}, {self.hi:.3f}]"

    @property
    def faster(self) -> bool:
        """Faster by a margin the rounds support: the interval lies above 1."""
        return self.lo > 1.0

    @property
    def slower(self) -> bool:
        """Slower beyond noise: the interval lies below 1, or the median is below SLOWER_MEDIAN."""
        return self.hi < 1.0 or self.median < SLOWER_MEDIAN


def ratio(per_round: Sequence[float]) -> Ratio:
    """The Ratio of per-round ratios (each default seconds / candidate seconds)."""
    xs = [float(x) for x in per_round if x is not None and math.isfinite(x) and x > 0]
    if not xs:
        raise ValueError("no round to compute a ratio from")
    n = len(xs)
    if n == 1:
        return Ratio(median=xs[0], lo=0.0, hi=math.inf, rounds=1)
    logs = [math.log(x) for x in xs]
    mean = sum(logs) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (n - 1))
    half = t95(n - 1) * sd / math.sqrt(n)
    return Ratio(median=_median(xs), lo=math.exp(mean - half), hi=math.exp(mean + half), rounds=n)


def round_ratios(default_s: Sequence[Sequence[float]], cand_s: Sequence[Sequence[float]]) -> list[float]:
    """Per round, the geometric mean over problems of default/candidate seconds.
    default_s[i][r]: problem i, round r."""
    rounds = min(min(len(d) for d in default_s), min(len(c) for c in cand_s))
    out = []
    for r in range(rounds):
        logs = [math.log(d[r] / c[r]) for d, c in zip(default_s, cand_s)]
        out.append(math.exp(sum(logs) / len(logs)))
    return out


def verdict(default_s: Sequence[Sequence[float]], cand_s: Sequence[Sequence[float]],
            names: Sequence[str]) -> dict:
    """Should a candidate replace the default on these problems? default_s/cand_s[i][r] are
    seconds of problem i in round r. Returns overall (Ratio of the geometric mean), per
    problem Ratios, `slower` (problems slower beyond noise) and `adopt`."""
    overall = ratio(round_ratios(default_s, cand_s))
    per = {n: ratio([d / c for d, c in zip(ds, cs)]) for n, ds, cs in zip(names, default_s, cand_s)}
    slower = [n for n, r in per.items() if r.slower]
    return {"overall": overall, "per_problem": per, "slower": slower,
            "adopt": overall.faster and not slower}


# ---------------------------------------------------------------- racing

# A ratio whose whole interval lies in [TIE_LO, TIE_HI] is a tie: no decision would change.
TIE_LO, TIE_HI = SLOWER_MEDIAN, 1.0 / SLOWER_MEDIAN


def settled(r: Ratio) -> bool:
    """Its decision is made: the interval excludes 1, or lies within the tie band."""
    return r.lo > 1.0 or r.hi < 1.0 or (r.lo >= TIE_LO and r.hi <= TIE_HI)


def race_step(default_s, candidates: dict, names: Sequence[str]) -> dict:
    """One decision of a race after a round: which candidates to keep timing.

    default_s[i][r] and candidates[c][i][r] are seconds of problem i in round r (the same
    rounds for all). A candidate is dropped when it cannot be adopted any more -- slower
    beyond noise overall or on one problem, or tied with the default -- or when it is
    clearly slower than the best candidate (the interval of its ratio to that one lies
    below 1). It is kept while its verdict against the default is open, or settled as
    faster. Returns {candidate: "faster" | "open" | "slower" | "tie" | "worse"}; the race
    is over when no candidate is "open"."""
    out, medians = {}, {}
    for c, secs in candidates.items():
        v = verdict(default_s, secs, names)
        o = v["overall"]
        medians[c] = o.median
        if v["slower"] or o.hi < 1.0:
            out[c] = "slower"
        elif o.lo > 1.0:
            out[c] = "faster"
        elif settled(o):
            out[c] = "tie"
        else:
            out[c] = "open"
    contenders = [c for c in candidates if out[c] in ("faster", "open")]
    if contenders:
        best = max(contenders, key=lambda c: medians[c])
        for c in contenders:
            if c != best and ratio(round_ratios(candidates[best], candidates[c])).hi < 1.0:
                out[c] = "worse"
    return out
