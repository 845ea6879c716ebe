"""The acceptance gate before emit: the candidate library (the default knobs, plus each tuned
shape class's winners) against the default build, so that no layer the library serves is
slower than it would be untuned.

- Each tuned shape class is timed on its tuned shapes, on the cells its changed knob
  classes reach: every weight dtype x {decode, prefill128, prefill512} x {1 thread, all
  threads}, kept where a changed class's domain covers the cell's kernel path and dtype.
  Default and candidate run in interleaved rounds (tuner/measure/interleave.py) until every
  cell's 95% interval has settled (it excludes 1, or lies within the tie band;
  tuner/decide.py), or the most rounds. A cell is slower when its interval's upper bound
  is < 1.0 or its median < 0.98; then every changed class of that shape class whose
  domain covers the cell falls back to its defaults (a slower cell no changed class covers
  reverts them all: a domain the knobs file misses, or noise, and either way the default
  is the safe side), the candidate is rebuilt and the gate runs again, until it passes or
  the candidate is the default.
- A shape outside every tuned class (olmoe-1b-7b unless it was tuned) must run the
  default's code: the candidate's layer of that shape picks the default kernel table, and
  that table's machine code is the default build's, function by function. Such a shape
  cannot be slower, so it is not timed; if either check fails, every class reverts.
The candidate is also verified against the NumPy reference on every timed problem first.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys

from colibri import quant
from colibri_build import render, shapes
from tuner import decide
from tuner.build import codehash, variants
from tuner.build.signature import variant_id
from tuner.measure import interleave, problems as problems_mod

# every weight dtype a user can run: the class search times the int4 part on int4 and its
# gemm knobs on int4g32 (colibri_build.parts.timed_dtype); the gate checks both formats on
# every path
DTYPES = quant.DTYPES

PHASES = ("decode", "prefill128", "prefill512")
# shapes a gate checks for the default's code, in order of preference: the first one no
# tuned class holds (real models; tiny last)
OUTSIDE_ORDER = ("olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b", "tiny")


def matrix(shapes_, dtypes=DTYPES, phases=PHASES) -> list[str]:
    """Problem names of the validation matrix, shape outer, then phase, then dtype: the
    phases given, and the one of each kernel path for the shape (problems.path_phase: a
    shape with few experts reaches the prefill dot kernels below prefill128)."""
    from colibri_build.render import PATHS

    out = []
    for s in shapes_:
        mine = dict.fromkeys([*phases, *(problems_mod.path_phase(s, p) for p in PATHS)])
        out += [f"{s}/{ph}/{d}" for ph in mine for d in dtypes]
    return out


def owners(spec, changed: dict[str, list[str]], problem, knobs=(), amx: bool = False) -> list[str]:
    """The changed classes whose domain covers the problem's kernel path and dtype, under
    any of `knobs` (flat knob values: the default's and the candidate's, whose gemm
    thresholds and layouts may differ; none: the template's defaults), on a build with AMX
    tiles or not."""
    paths = {problems_mod.path_of(problem, k, amx) for k in knobs or [None]}
    return [c for c in changed if any(spec.class_domain(c).covers(path, problem.part) for path in paths)]


def _threads(cfg_threads) -> list[int]:
    n = cfg_threads or os.cpu_count() or 1
    return sorted({1, n})


def changed_classes(t, knobs: dict) -> dict[str, dict[str, list[str]]]:
    """Shape class -> {knob class: its knobs whose value differs from the default build's
    for that shape class}."""
    out = {}
    for sc in {*shapes.split(knobs)[1], *shapes.split(t.default_assignment)[1]}:
        mine, dflt = shapes.for_class(knobs, sc), shapes.for_class(t.default_assignment, sc)
        diff = {}
        for cls, ks in t.classes.items():
            d = [k for k in ks if mine.get(k) != dflt.get(k)]
            if d:
                diff[cls] = d
        if diff:
            out[sc] = diff
    return out


def outside_shape(tuned: set[str], wanted=()) -> str | None:
    """A reference shape whose shape class no tuned class holds (from `wanted` first)."""
    for s in (*wanted, *OUTSIDE_ORDER):
        p = problems_mod.SHAPES.get(s)
        if p and shapes.class_of(p["H"], p["I"]) not in tuned:
            return s
    return None


def run_gate(t, knobs: dict, tuned_shapes: dict[str, list[str]]) -> dict:
    """Check the candidate `knobs` (a knob assignment with shape classes) against t.default;
    tuned_shapes: shape class -> the shapes it was tuned on. Returns the knobs to emit and
    the record the manifest keeps: every cell's ratio and interval, the reverted classes
    and why, each pass of the gate, the outside shape's checks."""
    cfg = t.cfg
    threads = list(cfg.gate_threads or _threads(cfg.threads))
    record = {"shapes": sorted({s for v in tuned_shapes.values() for s in v}),
              "phases": list(PHASES), "dtypes": list(DTYPES), "threads": threads,
              "rounds": [3, cfg.gate_rounds], "min_seconds": cfg.gate_min_seconds,
              "rule": f"a cell is slower when the upper bound of its 95% interval is < 1.0 or its "
                      f"median ratio < {decide.SLOWER_MEDIAN}; rounds stop once every cell's "
                      f"interval excludes 1 or lies within [{decide.TIE_LO}, {decide.TIE_HI:.4f}], "
                      f"or once each class owning a cell that does not has a cell whose interval "
                      f"lies below 1",
              "passes": [], "reverted": {}, "cells": [], "outside": None,
              "read_bandwidth_gbps": t.read_bandwidth()}
    cand = dict(knobs)
    changed = changed_classes(t, cand)
    if not changed:
        t.say("gate: the candidate is the default build: nothing to check")
        record.update(knobs=cand, passed=True, note="the candidate is the default")
        return record
    extra = [s for s in (cfg.gate_shapes or ()) if s in problems_mod.SHAPES]
    while changed:
        cached = _cache_path(t, cand, threads, tuned_shapes)
        if cached.exists():
            t.say(f"gate: this candidate was checked before: taken from {cached.name}")
            return json.loads(cached.read_text())
        t.say("gate: building the candidate and the default build (what is out of date)")
        libs = _build(t, cand)
        if isinstance(libs, str):  # the candidate does not build: ship the default
            record["passes"].append({"knobs": dict(cand), "error": libs})
            for sc, classes in changed.items():
                for cls in classes:
                    record["reverted"].setdefault(f"{sc}/{cls}", {"cells": [libs]})
            cand = dict(t.default_assignment)
            break
        outside = _check_outside(t, cand, libs, set(changed), extra)
        record["outside"] = outside
        if outside.get("shape") and outside["shape"] not in record["shapes"]:
            record["shapes"].append(outside["shape"])
        probs, owner = _cells(t, cand, changed, tuned_shapes, extra)
        t.say(f"gate: shape class(es) {', '.join(changed)} against the default build on "
              f"{len(probs)} problem(s) x threads {threads}, up to {cfg.gate_rounds} interleaved rounds")
        cells = _measure(t, libs, probs, threads, owner)
        revert = _judge(t, cells, owner, changed)
        if not outside["ok"]:
            for sc, classes in changed.items():
                for cls in classes:
                    revert.setdefault((sc, cls), []).append(f"{outside['shape']}: {outside['why']}")
        record["passes"].append({"knobs": dict(cand), "vid": variant_id(cand),
                                 "changed": changed, "cells": cells,
                                 "reverted": sorted(f"{sc}/{c}" for sc, c in revert)})
        record["cells"] = cells
        _print_cells(t, cells)
        if not revert:
            break
        for (sc, cls), why in revert.items():
            t.say(f"gate: class {cls} of shape class {sc} reverts to its defaults: slower on "
                  f"{len(why)} cell(s): " + "; ".join(why[:4]) + (" ..." if len(why) > 4 else ""))
            mine = shapes.for_class(cand, sc)
            record["reverted"][f"{sc}/{cls}"] = {"knobs": {k: mine[k] for k in t.classes[cls]},
                                                 "cells": why}
            cand = _revert(t, cand, sc, cls)
        changed = changed_classes(t, cand)
        if not changed:
            t.say("gate: every tuned class reverted: the default build is emitted")
    record.update(knobs=cand, passed=True)
    if record["passes"]:
        from colibri_build.render import atomic_write
        atomic_write(_cache_path(t, knobs, threads, tuned_shapes), json.dumps(record, indent=1, default=str))
    return record


def _revert(t, cand: dict, sc: str, cls: str) -> dict:
    """The candidate with knob class `cls` of shape class `sc` back at the default build's."""
    base, tuned = shapes.split(cand)
    dflt = shapes.for_class(t.default_assignment, sc)
    tuned = {**tuned, sc: {**shapes.for_class(cand, sc), **{k: dflt[k] for k in t.classes[cls]}}}
    return shapes.join(base, tuned)


def _build(t, cand: dict):
    """(default library, candidate library) built as variants, or the build's error."""
    built = variants.build_batch(t.profile_name, [t.default_assignment, cand], t.work / "variants")
    broken = [b for b in built if b.lib is None]
    if broken:
        return broken[0].error.splitlines()[0] if broken[0].error else "build failed"
    return [b.lib for b in built]


def _cells(t, cand: dict, changed: dict, tuned_shapes: dict, extra) -> tuple[list, dict]:
    """The problems the gate times, and each one's (shape class, owners)."""
    probs, owner = [], {}
    for sc, classes in changed.items():
        names = list(dict.fromkeys([*tuned_shapes.get(sc, ()),
                                    *(s for s in extra if _class_of(s) == sc)]))
        for name in matrix(names):
            p = problems_mod.problem(name)
            own = owners(t.spec, classes, p, [shapes.for_class(t.default_assignment, sc),
                                              shapes.for_class(cand, sc)], t.amx)
            if own:
                probs.append(p)
                owner[p.name] = (sc, own)
    return probs, owner


def _class_of(shape: str) -> str:
    s = problems_mod.shape_dims(shape)
    return shapes.class_of(s["H"], s["I"])


def still_open(cells: list[dict], owner: dict) -> bool:
    """Whether another round could change what the gate does: some cell is unsettled and
    one of the classes owning it (owner: problem -> (shape class, classes)) has no cell
    settled as slower yet (its interval below 1). A class with such a cell reverts
    whatever its other cells do, so they need no more rounds."""
    def owners(c):
        sc, own = owner.get(c["problem"], (None, []))
        return {(sc, cls) for cls in own}

    decided = {o for c in cells if c.get("hi") is not None and c["hi"] < 1.0 for o in owners(c)}
    return any(not c.get("settled") and not owners(c) <= decided for c in cells)


def _measure(t, libs, probs, threads, owner: dict) -> list[dict]:
    cfg = t.cfg

    def cells_of(res) -> list[dict]:
        out = []
        for name, th in res.cells:
            d, c = res.seconds[(name, th)]
            cell = {"problem": name, "threads": th, "status": "ok"}
            if not d or not c:
                cell.update(status=res.status if not res.ok else "error",
                            reason=res.reason or "not measured")
            else:
                r = decide.ratio([a / b for a, b in zip(d, c)])
                cell.update(default_s=decide._median(d), candidate_s=decide._median(c),
                            median=r.median, lo=r.lo, hi=r.hi, rounds=r.rounds,
                            slower=r.slower, faster=r.faster, settled=decide.settled(r))
            out.append(cell)
        return out

    def step(res):
        return [0, 1] if still_open(cells_of(res), owner) else None

    res = interleave.interleave(libs, probs, threads=threads, weights_dir=t.work / "weights",
                                seed=cfg.seed, rounds=(3, cfg.gate_rounds),
                                min_seconds=cfg.gate_min_seconds, verify=[False, True], step=step,
                                timeout_s=cfg.worker_timeout_s, bandwidth=True, say=t.say)
    cells = cells_of(res)
    for c in cells:  # measured in the same rounds as the cell's timings
        c["read_bandwidth_gbps"] = res.read_bandwidth(c["threads"])
    if res.verified and res.verified[1] and res.verified[1].get("status") != "ok":
        v = res.verified[1]
        for c in cells:
            c.update(status=v["status"], reason=v.get("reason", ""))
    t.say(f"gate: {res.rounds} round(s) in {res.wall_s:.0f} s ({res.ready_s:.0f} s of it loading and checking)")
    return cells


def _judge(t, cells, owner, changed) -> dict:
    revert: dict[tuple, list[str]] = {}
    for c in cells:
        sc, own = owner.get(c["problem"], (None, []))
        c["shape_class"], c["owners"] = sc, own
        if c["status"] != "ok":  # a candidate that fails a cell is not shipped at all
            for s, classes in changed.items():
                for cls in classes:
                    revert.setdefault((s, cls), []).append(
                        f"{c['problem']} at {c['threads']} thread(s): {c['status']} "
                        f"{c.get('reason', '')[:200]}")
        elif c["slower"]:
            what = (f"{c['problem']} at {c['threads']} thread(s): {c['median']:.3f}x "
                    f"[{c['lo']:.3f}, {c['hi']:.3f}]")
            for cls in own:
                revert.setdefault((sc, cls), []).append(what)
    return revert


def _check_outside(t, cand: dict, libs, tuned: set[str], extra) -> dict:
    """A shape no tuned class holds: its layer must pick the same kernel table in the
    candidate as in the default build, and that table must be the same machine code."""
    from colibri.layer import MoELayer

    import numpy as np

    shape = outside_shape(tuned, extra)
    if shape is None:
        return {"shape": None, "ok": True, "why": "every reference shape is tuned"}
    s = problems_mod.shape_dims(shape)
    rng = np.random.default_rng(0)
    H, I = s["H"], s["I"]
    w = lambda *sh: rng.standard_normal(sh, dtype=np.float32) * np.float32(0.02)  # noqa: E731
    tables = []
    for lib in libs:  # two experts of the shape's sizes: the dispatch looks at the sizes only
        with MoELayer(w(2, H), w(2, I, H), w(2, I, H), w(2, H, I), top_k=1, lib=str(lib)) as layer:
            tables.append(layer.kernels)
    ids = [variant_id(t.default_assignment), variant_id(cand)]
    table = tables[1]
    sub = None if table == render.DEFAULT_TABLE else table
    diff = codehash.differing(*(variants.kernel_code(t.work / "variants", t.profile_name, v,
                                                     table=sub) for v in ids))
    ok = tables[0] == tables[1] and diff == []
    why = ("runs the default build's machine code" if ok else
           f"its layers run kernel table {table!r}, the default build's {tables[0]!r}"
           if tables[0] != tables[1] else
           "the candidate's table is not the default build's code"
           + (f" ({', '.join(diff[:5])} differ)" if diff else " (unreadable objects)"))
    t.say(f"gate: {shape} (shape class {shapes.class_of(H, I)}, not tuned in this run): {why}"
          + (": not timed" if ok else ""))
    return {"shape": shape, "shape_class": shapes.class_of(H, I), "kernels": table,
            "identical_code": diff == [], "ok": ok, "why": why}


def _cache_path(t, cand: dict, threads, tuned_shapes: dict):
    """Where the gate's record of this candidate is kept (beside the store): the signatures
    of both libraries, the shapes, the rounds and the timing."""
    p = problems_mod.problem(matrix(["tiny"])[0])
    keys = [t.key(k, p) for k in (t.default_assignment, cand)]
    h = hashlib.sha256(json.dumps([t.store_path.name, keys, threads, t.cfg.gate_rounds,
                                   t.cfg.gate_min_seconds,
                                   sorted(t.cfg.gate_shapes or ()), sorted(tuned_shapes.items())])
                       .encode()).hexdigest()[:20]
    return t.store_path.with_name(f"gate-{h}.json")


def _print_cells(t, cells) -> None:
    for c in cells:
        if c["status"] != "ok":
            t.say(f"  {c['problem']:34} {c['threads']:>2} thr  {c['status']}: {c.get('reason', '')[:120]}")
        else:
            mark = "SLOWER" if c["slower"] else "faster" if c["faster"] else ""
            t.say(f"  {c['problem']:34} {c['threads']:>2} thr  {c['median']:.3f}x "
                  f"[{c['lo']:.3f}, {c['hi']:.3f}] {c['rounds']} rounds {mark}")


def summary_line(record: dict) -> str:
    cells = [c for c in record.get("cells", []) if c.get("status") == "ok"]
    if not record.get("passes"):
        return "gate: " + record.get("note", "not run")
    meds = sorted(c["median"] for c in cells)
    spread = f"; ratios {meds[0]:.3f}-{meds[-1]:.3f}" if meds else ""
    rev = record.get("reverted") or {}
    out = record.get("outside") or {}
    outside = (f"; {out['shape']} (untuned) {out['why']}" if out.get("shape") else "")
    return (f"gate: {len(record['passes'])} pass(es) over {len(cells)} cell(s){spread}; "
            + (f"reverted {', '.join(rev)}" if rev else "no class reverted") + outside)


def print_gate(record: dict, out=None) -> None:
    out = out or sys.stdout
    print(summary_line(record), file=out)
    for cls, r in (record.get("reverted") or {}).items():
        print(f"  {cls} reverted to its defaults: {'; '.join(r['cells'][:3])}"
              + (" ..." if len(r["cells"]) > 3 else ""), file=out)
