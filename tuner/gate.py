"""The acceptance gate before emit: the candidate library (every class's winner) against
the default build, interleaved, on a validation matrix, so that no cell the library
serves is slower than it would be untuned.

Matrix: every weight dtype x {decode, prefill128, prefill512} x {the tuned shape, a shape
it was not tuned on} x {1 thread, all threads}. Each cell's speed ratio (default seconds /
candidate seconds, per round) gets a 95% interval (tuner/decide.py). A cell is
slower when the interval's upper bound is < 1.0 or its median < 0.98; then every tuned
class whose domain covers the cell (its kernel path and dtype) falls back to its
defaults (a slower cell no changed class covers reverts them all: a domain the knobs
file misses, or noise, and either way the default is the safe side), the candidate is
rebuilt and the gate runs again, until it passes or the candidate is the default.
The candidate is also verified against the NumPy reference on every dtype first.
"""
from __future__ import annotations

import os
import sys

from colibri.quant import DTYPES
from tuner import decide
from tuner.build import variants
from tuner.build.signature import variant_id
from tuner.measure import problems as problems_mod, weights, worker

PHASES = ("decode", "prefill128", "prefill512")
# the shape a tuned shape is validated on besides itself: another real model whose
# weights stay small enough to build twice in memory
OTHER_SHAPE = {"olmoe-1b-7b": "qwen3-30b-a3b"}
DEFAULT_OTHER = "olmoe-1b-7b"


def validation_shapes(tuned: list[str]) -> list[str]:
    """The tuned shapes and one shape none of them is (for each reference shape)."""
    out = list(dict.fromkeys(tuned))
    for s in tuned:
        other = OTHER_SHAPE.get(s, DEFAULT_OTHER)
        if s in problems_mod.SHAPES and s != "tiny" and other not in out:
            out.append(other)
            break
    return out


def matrix(shapes, dtypes=DTYPES, phases=PHASES) -> list[str]:
    """Problem names of the validation matrix, shape outer, then phase, then dtype."""
    return [f"{s}/{ph}/{d}" for s in shapes for ph in phases for d in dtypes]


def owners(spec, changed: dict[str, list[str]], problem) -> list[str]:
    """The changed classes whose domain covers the problem's kernel path and dtype."""
    path = problems_mod.path_of(problem)
    return [c for c in changed if spec.class_domain(c).covers(path, problem.dtype)]


def _threads(cfg_threads) -> list[int]:
    n = cfg_threads or os.cpu_count() or 1
    return sorted({1, n})


def run_gate(t, knobs: dict, classes: list[dict]) -> dict:
    """Check the candidate `knobs` against t.default; returns the knobs to emit and the
    record the manifest keeps: every cell's ratio and interval, the reverted classes and
    why, each pass of the gate."""
    cfg = t.cfg
    shapes = list(cfg.gate_shapes or validation_shapes(
        list(dict.fromkeys(p.shape for p in t.all_problems))))
    names = matrix(shapes)
    probs = [problems_mod.problem(n) for n in names]
    threads = list(cfg.gate_threads or _threads(cfg.threads))
    record = {"shapes": shapes, "phases": list(PHASES), "dtypes": list(DTYPES), "threads": threads,
              "rounds": cfg.gate_rounds, "min_seconds": cfg.gate_min_seconds,
              "rule": f"a cell is slower when the upper bound of its 95% interval is < 1.0 or its "
                      f"median ratio < {decide.SLOWER_MEDIAN}",
              "passes": [], "reverted": {}, "cells": []}
    cand = dict(knobs)
    changed = _changed(t, cand)
    if not changed:
        t.say("gate: the candidate is the default build: nothing to check")
        record.update(knobs=cand, passed=True, note="the candidate is the default")
        return record
    for p in probs:
        weights.ensure(t.work / "weights", p, cfg.seed, progress=t.say)
    while changed:
        cached = _cache_path(t, cand, probs, threads)
        if cached.exists():
            t.say(f"gate: this candidate was checked on this matrix before: taken from {cached.name}")
            import json
            return json.loads(cached.read_text())
        t.say(f"gate: candidate (classes {', '.join(changed)} tuned) against the default build on "
              f"{len(probs)} problems x threads {threads}, {cfg.gate_rounds} interleaved rounds")
        cells = _recheck_noisy(t, cand, _measure(t, cand, probs, threads))
        failed = [c for c in cells if c["status"] != "ok"]
        slower = [c for c in cells if c["status"] == "ok" and c["slower"]]
        for c in cells:
            if c["status"] == "ok":
                c["owners"] = owners(t.spec, changed, problems_mod.problem(c["problem"]))
        revert: dict[str, list[str]] = {}
        for c in failed:  # a candidate that fails a cell is not shipped at all
            for cls in changed:
                revert.setdefault(cls, []).append(f"{c['problem']} at {c['threads']} thread(s): "
                                                  f"{c['status']} {c.get('reason', '')[:200]}")
        for c in slower:
            what = (f"{c['problem']} at {c['threads']} thread(s): {c['median']:.3f}x "
                    f"[{c['lo']:.3f}, {c['hi']:.3f}]")
            if c["owners"]:
                for cls in c["owners"]:
                    revert.setdefault(cls, []).append(what)
            elif c["median"] < decide.SLOWER_MEDIAN:
                # slower by more than the noise floor where no changed knob should act: the
                # knobs file misses a domain, and only the default is known to be safe
                for cls in changed:
                    revert.setdefault(cls, []).append(what + " (outside every tuned class's domain)")
            else:
                c["note"] = "slower outside every tuned class's domain, within 2%: not attributed"
        record["passes"].append({"knobs": dict(cand), "vid": variant_id(cand), "changed": changed,
                                 "cells": cells, "reverted": sorted(revert)})
        record["cells"] = cells
        _print_cells(t, cells)
        if not revert:
            break
        for cls, why in revert.items():
            t.say(f"gate: class {cls} reverts to its defaults: slower on {len(why)} cell(s): "
                  + "; ".join(why[:4]) + (" ..." if len(why) > 4 else ""))
            record["reverted"][cls] = {"knobs": {k: cand[k] for k in t.classes[cls]}, "cells": why}
            cand.update({k: t.default[k] for k in t.classes[cls]})
        changed = _changed(t, cand)
        if not changed:
            t.say("gate: every tuned class reverted: the default build is emitted")
    record.update(knobs=cand, passed=True)
    if record["passes"]:
        import json

        from colibri_build.render import atomic_write
        atomic_write(_cache_path(t, knobs, probs, threads), json.dumps(record, indent=1))
    return record


def _cache_path(t, cand: dict, probs, threads):
    """Where the gate's record of this candidate on this matrix is kept (beside the store):
    the signatures of both libraries on every cell, the rounds and the timing."""
    import hashlib

    keys = [t.key(k, p) for k in (t.default, cand) for p in probs]
    h = hashlib.sha256(("".join(keys) + f"/{threads}/{t.cfg.gate_rounds}/{t.cfg.gate_min_seconds}")
                       .encode()).hexdigest()[:20]
    return t.store_path.with_name(f"gate-{h}.json")


def _changed(t, cand: dict) -> dict[str, list[str]]:
    """Class -> its knobs whose value differs from the default (classes in tuning order)."""
    out = {}
    for cls, ks in t.classes.items():
        diff = [k for k in ks if cand.get(k) != t.default.get(k)]
        if diff:
            out[cls] = diff
    return out


def _recheck_noisy(t, cand: dict, cells: list[dict]) -> list[dict]:
    """Cells slower by their median alone, with an interval reaching above 1, are too noisy
    to decide on (one disturbed round moves the median of a few): measure them again with
    twice the rounds and decide on that; the first measurement stays in the cell."""
    noisy = [c for c in cells if c["status"] == "ok" and c["slower"] and c["hi"] >= 1.0]
    if not noisy:
        return cells
    t.say(f"gate: {len(noisy)} cell(s) slower only by a noisy median: measuring them again "
          f"with {2 * t.cfg.gate_rounds} rounds")
    again = {}
    for th in sorted({c["threads"] for c in noisy}):
        probs = [problems_mod.problem(c["problem"]) for c in noisy if c["threads"] == th]
        for c in _measure(t, cand, probs, [th], rounds=2 * t.cfg.gate_rounds):
            again[(c["problem"], c["threads"])] = c
    out = []
    for c in cells:
        new = again.get((c["problem"], c["threads"]))
        out.append(dict(new, first=c) if new else c)
    return out


def _measure(t, cand: dict, probs, threads, rounds: int | None = None) -> list[dict]:

    built = variants.build_batch(t.profile_name, [t.default, cand], t.work / "variants")
    broken = [b for b in built if b.lib is None]
    if broken:
        why = broken[0].error.splitlines()[0] if broken[0].error else "build failed"
        return [{"problem": p.name, "threads": th, "status": "compile_error", "reason": why}
                for p in probs for th in threads]
    job = {"libs": [str(b.lib) for b in built], "problems": [{"name": p.name} for p in probs],
           "threads": threads, "rounds": rounds or t.cfg.gate_rounds, "min_seconds": t.cfg.gate_min_seconds,
           "warmup": 1, "verify": [False, True], "weights_dir": str(t.work / "weights"),
           "seed": t.cfg.seed}
    res = worker.compare(job, t.cfg.worker_timeout_s * len(probs), 2 * worker.memory_cap(probs))
    cells = []
    for r in res:
        cell = {"problem": r["problem"], "threads": r["threads"], "status": r["status"]}
        if r["status"] != "ok":
            cell["reason"] = r.get("reason", "")
        else:
            d, c = r["seconds"]
            ratio = decide.ratio([a / b for a, b in zip(d, c)])
            cell.update(default_s=decide._median(d), candidate_s=decide._median(c),
                        median=ratio.median, lo=ratio.lo, hi=ratio.hi, rounds=ratio.rounds,
                        slower=ratio.slower, faster=ratio.faster)
        cells.append(cell)
    return cells


def _print_cells(t, cells) -> None:
    for c in cells:
        if c["status"] != "ok":
            t.say(f"  {c['problem']:34} {c['threads']:>2} thr  {c['status']}: {c.get('reason', '')[:120]}")
        else:
            mark = "SLOWER" if c["slower"] else "faster" if c["faster"] else ""
            t.say(f"  {c['problem']:34} {c['threads']:>2} thr  {c['median']:.3f}x "
                  f"[{c['lo']:.3f}, {c['hi']:.3f}] {mark}")


def summary_line(record: dict) -> str:
    cells = [c for c in record.get("cells", []) if c.get("status") == "ok"]
    if not record.get("passes"):
        return "gate: " + record.get("note", "not run")
    meds = sorted(c["median"] for c in cells)
    spread = f"; ratios {meds[0]:.3f}-{meds[-1]:.3f}" if meds else ""
    rev = record.get("reverted") or {}
    return (f"gate: {len(record['passes'])} pass(es) over {len(cells)} cell(s){spread}; "
            + (f"reverted {', '.join(rev)}" if rev else "no class reverted"))


def print_gate(record: dict, out=None) -> None:
    out = out or sys.stdout
    print(summary_line(record), file=out)
    for cls, r in (record.get("reverted") or {}).items():
        print(f"  {cls} reverted to its defaults: {'; '.join(r['cells'][:3])}"
              + (" ..." if len(r["cells"]) > 3 else ""), file=out)
