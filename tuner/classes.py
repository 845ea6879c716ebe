"""One knob class, tuned on its problems (tuner/run.py calls it per class, in order):

1. its space: the class's knobs over their values (--quick: their quick values), every
   other knob at the values already chosen; knobs that cannot change this build's code
   held at their defaults;
2. the search: each point built, its machine code compared with the class default's
   (the same code is a tie and is not timed), then verified and timed alone in a worker
   (the store keeps every result); a problem whose machine code (its dtype's part and the
   router's f32 part) another variant was timed with takes that timing. When the
   candidates are no more than the race takes, there is no search: they go to the race;
3. the race: the best few and the default timed in interleaved rounds (verified first when
   not screened, whose rounds the store then keeps as their timings); after each round a
   candidate that can no longer be adopted, or is clearly slower than the best, is
   dropped, and the race ends as soon as no verdict is open (decide.race_step), or at the
   class's time budget;
4. the choice: a finalist replaces the default only when decide.verdict adopts it.

A class's whole result is kept beside the store under the hash of everything it measured
(every point's signature on every problem, the race's settings): a re-run that would
measure the same things takes it from there.
"""
from __future__ import annotations

import hashlib
import json
import os

from colibri_build import render
from tuner import decide
from tuner.build import variants
from tuner.build.signature import variant_id
from tuner.context import KERNEL
from tuner.measure import interleave, worker


def tune_class(t, cls: str, base: dict) -> dict:
    """Search and race one class's knobs on t.problems; the class's record (its winner in
    "winner")."""
    import random

    from tuner import search

    cfg = t.cfg
    t.current_class = cls
    space = t.class_space(cls, base)
    seeded = registry_seeds(t, cls, base, space) if cfg.registry else None
    seeds = tuple(seeded["points"]) if seeded else ()
    start = [k for k in (base, *seeds, *cfg.start_points) if space.contains(k)]
    max_evals = cfg.max_evals or (space.size() if cfg.quick else None)
    if seeds and not cfg.max_evals:
        # stop once the start points (this class's base and the registry's variants)
        # are measured here: the registry's search already covered the rest
        max_evals = len({variant_id(space.normalise(k)) for k in start})
    budget = search.Budget(max_evals=max_evals, max_seconds=cfg.budget_s)
    name = cfg.strategy or search.choose_default(space, budget)
    t.strategy = name
    knobs = t.classes[cls]
    t.say(f"class {cls} ({', '.join(knobs)}): {space.size()} variant(s) on "
          f"{', '.join(p.name for p in t.problems)}; strategy {name}")
    # the class's default goes first (its knobs at the profile's defaults, the knobs of
    # classes already tuned at their winners): every class knows what tuning bought
    dflt = t.default_for(t.current_shape)
    baseline = {**base, **{k: dflt[k] for k in knobs if k in dflt}}
    ahead = start if seeds and not cfg.max_evals else list(space.points())
    cache = _cache_path(t, cls, baseline, ahead if name == "exhaustive" else [baseline], name, budget)
    if cache.exists():
        t.say(f"class {cls}: nothing new to measure: its result is taken from {cache.name}")
        return json.loads(cache.read_text())
    # exhaustive search knows its points up front: build them ahead, a chunk at a time, the
    # default first (always built: its machine code is what the others are compared with)
    prebuilt = _Ahead(t, [baseline] + [k for k in (ahead if name == "exhaustive" else [])
                                       if variant_id(k) != variant_id(baseline)],
                      force=variant_id(baseline))
    b = prebuilt.get(variant_id(baseline))
    t.baseline = (baseline, t.code(baseline)) if b is not None and b.lib is not None else None
    same = _all_same_code(t, prebuilt, ahead if name == "exhaustive" else [], baseline)
    if same:
        t.baseline = None
        why = (f"its knobs reach no compiled code on this profile: all {len(same)} other "
               f"variant(s) are the default's machine code")
        t.say(f"class {cls}: not tuned: {why}")
        return {"class": cls, "knobs": list(knobs), "skipped": why, "same_code_as_default": same}
    try:
        direct = _race_only(t, prebuilt, ahead, baseline) if name == "exhaustive" else None
        if direct is not None:
            # a screening pass would only pick the finalists the race takes anyway
            t.say(f"class {cls}: {len(direct) - 1} candidate(s), as many as the race takes: "
                  f"verified and raced against the default, without a screening pass")
            raced, bw = race(t, cls, direct, baseline, verify=True)
            evaluations = sum(variant_id(k) not in (variant_id(baseline), *t.identical) for k in ahead)
            default_cost = next((r["cost"] for r in raced if r["is_default"]), None)
            if not raced:  # every candidate failed its check: the default alone, as screened
                default_cost = t.evaluate(baseline, prebuilt)
                raced, bw = race(t, cls, [baseline] if default_cost is not None else [], baseline)
        else:
            default_cost = t.evaluate(baseline, prebuilt)
            result = search.STRATEGIES[name].search(space, lambda k: t.evaluate(k, prebuilt), budget,
                                                    rng=random.Random(cfg.seed), start=start or None)
            evaluations = result.evaluations
            raced, bw = race(t, cls, finalists(t, result, baseline), baseline)
    finally:
        t.baseline = None
    winner = choose(t, cls, raced)
    same = sorted(v for v, d in t.identical.items() if d == variant_id(baseline))
    out = {"class": cls, "knobs": list(knobs), "problems": [p.name for p in t.problems],
           "strategy": name, "space_size": space.size(), "evaluations": evaluations,
           "default": baseline, "default_cost": default_cost, "finalists": raced,
           "winner": winner, "registry": seeded, "same_code_as_default": same,
           # measured in the race's rounds (else the run's probe): what "% of bw" divides by
           "read_bandwidth_gbps": bw or t.read_bandwidth()}
    if winner is not None:
        render.atomic_write(cache, json.dumps(out, indent=1, default=str))
    return out


def _all_same_code(t, prebuilt, points: list[dict], baseline: dict) -> list[str]:
    """The variant ids of `points` when every one of them built and has the baseline's
    machine code, else []."""
    if t.baseline is None or t.baseline[1] is None:
        return []
    others = [k for k in points if variant_id(k) != variant_id(baseline)]
    for k in others:
        b = prebuilt.get(variant_id(k))
        if b is None or b.lib is None or not t.same_code_as_baseline(k):
            return []
    return [variant_id(k) for k in others]


def _race_only(t, prebuilt, points: list[dict], baseline: dict) -> list[dict] | None:
    """The candidates of `points` and the default, when the built candidates that differ from
    the default's machine code are no more than the race's finalists (a screening pass
    would pick them all); else None. Candidates that failed to build are recorded."""
    others = [k for k in points if variant_id(k) != variant_id(baseline)]
    if not others or len(others) > t.cfg.finalists or t.baseline is None:
        return None
    out = []
    for k in others:
        b = prebuilt.get(variant_id(k))
        if b is None:  # measured before: the store has it, so screen as usual
            return None
        if b.lib is None:
            t.evaluate(k, prebuilt)  # records the compile error
        elif t.tie_with_baseline(k):
            pass
        elif t.same_problem_code_as_baseline(k):
            t.say(f"  {t.label(k)}: the default's machine code on every problem of this class: "
                  f"not raced")
        else:
            out.append(k)
    return [*out, baseline] if out else None


def _cache_path(t, cls: str, baseline: dict, points: list[dict], strategy: str, budget):
    c = t.cfg
    keys = sorted(t.key(k, p) for k in [baseline, *points] for p in t.problems)
    h = hashlib.sha256(json.dumps([t.store_path.name, cls, keys, strategy, str(budget),
                                   c.finalists, c.race_rounds,
                                   c.race_min_seconds, c.race_budget_s, c.min_seconds,
                                   c.registry and str(c.registry)]).encode()).hexdigest()
    return t.store_path.with_name(f"class-{h[:20]}.json")


def choose(t, cls: str, retimed: list[dict]) -> dict | None:
    """The finalist decide.verdict adopts with the highest median ratio; else the default
    (a tie keeps it); with no working default, the fastest finalist."""
    if not retimed:
        return None
    dflt = next((r for r in retimed if r["is_default"]), None)
    if dflt is None:
        t.say(f"class {cls}: the default failed or was not raced: the fastest finalist wins")
        return min(retimed, key=lambda r: r["cost"])
    adopted = [r for r in retimed if not r["is_default"] and r["verdict"]["adopt"]]
    for r in retimed:
        if r["is_default"]:
            continue
        v = r["verdict"]
        why = ("adopted" if v["adopt"] else
               f"slower on {', '.join(v['slower'])}" if v["slower"] else "not faster beyond noise")
        t.say(f"  {t.label(r['knobs'])}: {v['overall']['median']:.3f}x "
              f"[{v['overall']['lo']:.3f}, {v['overall']['hi']:.3f}] over the default: {why}")
    if not adopted:
        t.say(f"class {cls}: keeps its default (no finalist faster beyond noise on every problem)")
        return dflt
    return max(adopted, key=lambda r: (r["verdict"]["overall"]["median"], r["verdict"]["overall"]["lo"]))


def registry_seeds(t, cls: str, base: dict, space) -> dict:
    """The registry's best variants of this class for this kind of host, as points of
    `space` (the class's knobs from the registry row, every other knob from `base`)."""
    from tuner.store import registry

    tuned_elsewhere = set(t.spec.knobs) - set(t.classes[cls])
    found = registry.seed_variants(
        t.cfg.registry, kernel=KERNEL, problems=[p.name for p in t.problems],
        profile=t.profile_name, microarchitecture=t.host.get("microarchitecture"),
        compiler=t.resolved.compiler.family, compiler_version=t.resolved.version,
        top=t.cfg.registry_top, ignore=tuple(tuned_elsewhere))
    points, taken, outside = [], [], 0
    for s in found["seeds"]:
        point = {**base, **s.knobs}  # this host's choices for the other classes' knobs
        if not space.contains(point):
            outside += 1
            continue
        points.append(point)
        taken.append({"vid": variant_id(point), "registry_cost": s.cost, "hosts": list(s.hosts),
                      "label": t.label(point)})
    who = (f"profile {t.profile_name}, microarchitecture {t.host.get('microarchitecture')}, "
           f"{t.resolved.compiler.family} {registry.major(t.resolved.version)}")
    if taken:
        t.say(f"registry {t.cfg.registry}: class {cls}: {found['matching_rows']} matching row(s) "
              f"({who}); seeding with {len(taken)} variant(s):")
        for r in taken:
            t.say(f"  {r['label']}  {r['registry_cost'] * 1e3:.3f} ms there "
                  f"(from {', '.join(r['hosts'])})")
    else:
        t.say(f"registry {t.cfg.registry}: class {cls}: nothing usable for {who} "
              f"({found['rows']} row(s) of these problems; unmatched {found['unmatched']}); "
              f"searching cold")
    if outside:
        t.say(f"  {outside} registry variant(s) lie outside this run's space: skipped")
    return {"points": points, "taken": taken, "matching_rows": found["matching_rows"],
            "unmatched": found["unmatched"], "outside_space": outside}


class _Ahead:
    """Builds of points known in advance, made a chunk at a time as the search reaches
    them: SCons compiles a chunk in parallel, and measuring starts before the whole
    space is compiled. `force`: a point built even when the store has its measurements
    (the class default, whose machine code the others are compared with)."""

    CHUNK = 16

    def __init__(self, t, order: list[dict], force: str | None = None):
        self.t, self.order, self.done, self.force = t, order, {}, force
        self.pos = {variant_id(k): i for i, k in enumerate(order)}

    def get(self, vid: str):
        if vid not in self.done and vid in self.pos:
            i = self.pos[vid]
            chunk = [k for k in self.order[i:i + self.CHUNK] if variant_id(k) not in self.done]
            self.done.update(self.t.build(chunk, force=self.force))
        return self.done.get(vid)


def finalists(t, result, baseline: dict) -> list[dict]:
    """The best few measured points (none with the default's machine code), and the default."""
    ok = [(c, k) for k, c in result.history
          if c is not None and variant_id(k) not in t.identical]
    ok.sort(key=lambda ck: ck[0])
    out, seen = [], set()
    for c, k in ok:
        vid = variant_id(k)
        if vid not in seen:
            seen.add(vid)
            out.append(k)
        if len(out) == t.cfg.finalists:
            break
    if variant_id(baseline) not in seen and t.cached(baseline) and t.cost(t.cached(baseline)):
        out.append(baseline)
    return out


def race(t, cls: str, finals: list[dict], baseline: dict,
         verify: bool = False) -> tuple[list[dict], float | None]:
    """The finalists and the default in interleaved rounds until the verdicts settle
    (decide.race_step), the most rounds, or the class's time budget: one entry per
    finalist (retime_entries), and the read bandwidth of the rounds (None without a race).
    verify: each is first checked against the NumPy reference (finalists not screened); one
    that fails is recorded in the store and left out."""
    if not finals:
        return [], None
    d = next((i for i, k in enumerate(finals) if variant_id(k) == variant_id(baseline)), None)
    if d is None or len(finals) == 1:  # nothing to race against
        return retime_entries(finals, [[[r.median_s] for r in t.cached(k)] for k in finals],
                              baseline, [p.name for p in t.problems]), None
    # the default first, as in every comparison (worker.Session loads index 0 last): last
    # in the list, the default was the first model loaded, which ran 4-9% slow on one
    # guest, so candidates won races by it and the gate reverted them
    finals, d = [finals[d], *finals[:d], *finals[d + 1:]], 0
    cfg = t.cfg
    threads = cfg.threads or os.cpu_count() or 1
    names = [p.name for p in t.problems]
    libs = [variants.variant_dir(t.work / "variants", t.profile_name, variant_id(k)) / "libcolibri.so"
            for k in finals]

    lo, hi = cfg.race_rounds
    t.say(f"racing {len(finals) - 1} finalist(s) against the default, {lo}-{hi} interleaved "
          f"rounds, at most {cfg.race_budget_s:.0f} s")
    # a library checked on these shapes and dtypes earlier in this run (the default, raced
    # in every class) is not checked again
    checks = [verify and not all((variant_id(k), p.shape, p.dtype) in t.verified for p in t.problems)
              for k in finals]
    res = interleave.interleave(libs, t.problems, threads=[threads], weights_dir=t.work / "weights",
                                seed=cfg.seed, rounds=(lo, hi), min_seconds=cfg.race_min_seconds,
                                warmup=1, verify=checks, step=interleave.race_rule(d, names),
                                budget_s=cfg.race_budget_s, timeout_s=cfg.worker_timeout_s,
                                bandwidth=True, say=t.say)
    if not res.ok:
        t.say(f"  the race failed: {res.status} {res.reason[:200]}")
        return [], None
    wrong = [i for i, v in enumerate(res.verified) if v is not None and v.get("status") != worker.STATUS_OK]
    for i in wrong:
        v = res.verified[i]
        t.say(f"  {t.label(finals[i])}: {v.get('status')} ({str(v.get('reason', '')).splitlines()[0][:160]})")
        for p in t.problems:
            t._put(finals[i], p, v.get("status", "wrong"), str(v.get("reason", "")))
    t.verified |= {(variant_id(finals[i]), p.shape, p.dtype) for i, v in enumerate(res.verified)
                   if v is not None and i not in wrong for p in t.problems}
    if d in wrong or len(wrong) == len(finals) - 1:  # nothing left to race against
        return [], None
    dropped = {i: r for i, r in res.dropped.items()}
    t.say(f"  {res.rounds} round(s) in {res.wall_s:.1f} s ({res.ready_s:.1f} s of it loading and checking)"
          + (f"; dropped after round(s) " + ", ".join(f"{dropped[i]} ({t.label(finals[i])})"
                                                      for i in sorted(dropped)) if dropped else ""))
    keep = [i for i in range(len(finals)) if i not in wrong]
    per_lib = [[res.seconds[(n, threads)][i] for n in names] for i in keep]
    if verify:  # not screened: the store keeps the race's rounds as their measurements
        for i, rounds in zip(keep, per_lib):
            new = [(p, x) for p, x in zip(t.problems, rounds) if x and t.store.get(t.key(finals[i], p)) is None]
            for p, samples in new:
                t._put(finals[i], p, worker.STATUS_OK, "", samples)
            t.measured += bool(new)
    return (retime_entries([finals[i] for i in keep], per_lib, baseline, names, rounds=res.rounds,
                           dropped={keep.index(i): r for i, r in dropped.items() if i in keep}),
            res.read_bandwidth(threads))


def retime_entries(finals: list[dict], per_lib, baseline: dict, names: list[str],
                   rounds: int | None = None, dropped: dict | None = None) -> list[dict]:
    """One entry per raced variant from its rounds (per_lib[i][problem][round] seconds): its
    cost, per-problem medians, and for a non-default variant decide.verdict against the
    default (on the rounds both ran)."""
    import math

    d = next((i for i, k in enumerate(finals) if variant_id(k) == variant_id(baseline)), None)
    out = []
    for i, k in enumerate(finals):
        meds = [decide._median(r) for r in per_lib[i]]
        cost = math.exp(sum(math.log(m) for m in meds) / len(meds))
        entry = {"knobs": k, "vid": variant_id(k), "cost": cost, "per_problem": meds,
                 "rounds": per_lib[i], "is_default": i == d,
                 "dropped_after": (dropped or {}).get(i)}
        if d is not None and i != d:
            v = decide.verdict(per_lib[d], per_lib[i], names)
            entry["verdict"] = {"overall": v["overall"].to_dict(), "slower": v["slower"],
                                "adopt": v["adopt"],
                                "per_problem": {n: r.to_dict() for n, r in v["per_problem"].items()}}
        out.append(entry)
    return out
