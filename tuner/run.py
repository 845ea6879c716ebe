"""`python -m tuner run`: probe -> profile -> per shape class: knob classes -> gate -> emit
-> report.

The problems come from the shapes tuned for (--shape, --shape-of, --problem; the
Qwen3-30B-A3B shape by default), grouped by shape class (colibri_build/shapes.py). Each
shape class is tuned on its own, knob class by knob class in the knobs file's order,
starting from the profile's defaults (tuner/classes.py). The candidate library carries the
defaults and, for each shape class, the values its classes adopted; the gate checks it
against the default build (tuner/gate.py), emit publishes it (tuner/build/emit.py) and the
report describes it (tuner/report/). tuner/context.py holds what the stages share.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from colibri_build import hostid, render, shapes
from colibri_build.paths import build_dir_default, reports_dir_default
from tuner import classes as classes_mod, summary as summary_mod
from tuner.build.signature import variant_id
from tuner.context import (KERNEL, Tuner, _current, default_problems, in_class, timed_problems,  # noqa: F401
                           load_warning, predefined_macros)
from tuner.measure import interleave
from tuner.measure import problems as problems_mod

print_summary = summary_mod.print_summary


@dataclass
class RunConfig:
    profile: str | None = None
    problems: tuple[str, ...] | None = None  # None: default_problems() of each tuned shape
    shapes: tuple[str, ...] | None = None    # shapes to tune for (None: the default shape)
    strategy: str | None = None          # None: search.choose_default
    max_evals: int | None = None
    budget_s: float | None = None
    quick: bool = False
    threads: int | None = None
    min_seconds: float = 0.5             # timing per (variant, problem)
    warmup: int = 3                      # untimed calls before it
    finalists: int = 3
    race_rounds: tuple[int, int] = (3, 10)  # a class's race: rounds before its first decision,
                                         # and the most it runs
    race_min_seconds: float = 0.25       # timing per library, problem and round of a race
    race_budget_s: float = 120.0         # a class's race stops after this much wall time
    seed: int = 0
    build_dir: Path = field(default_factory=build_dir_default)
    store_path: Path | None = None
    worker_timeout_s: float = 300.0
    emit: bool = True
    inject: dict | None = None           # tests: {vid or "*": fault} for the worker
    space_overrides: dict | None = None  # restrict knobs: {knob: [values]}
    start_points: tuple[dict, ...] = ()  # seeds for the search (e.g. from a registry)
    registry: Path | None = None         # a merged store: seed each class from its best rows
    registry_top: int = 3                # how many registry variants per class
    log: object = None                   # callable(str) for progress; default stderr
    report: bool = True                  # write the report at the end (tuner/report/__init__.py)
    report_dir: Path | None = None       # default reports/<host-id>/
    measure_bandwidth: bool = True       # probe the read bandwidth (for "% of bandwidth")
    wait: bool | float = False           # store locked by another run: False refuse, True
                                         # wait, a number wait at most that many seconds
    gate: bool = True                    # check the candidate against the default before emit
    gate_shapes: tuple[str, ...] | None = None   # more shapes the gate checks
    gate_threads: tuple[int, ...] | None = None  # None: 1 and all threads
    gate_rounds: int = 10                # the most interleaved rounds of the gate
    gate_min_seconds: float = 0.2        # timing per library per round


def weights_ready(t: Tuner) -> None:
    """The model files of every problem (made once per shape and dtype)."""
    interleave.prepare(t.all_problems, t.work / "weights", t.cfg.seed, progress=t.say)


def class_plan(t: Tuner, cls: str, probs: list, base: dict) -> tuple[list, str | None, set]:
    """Class `cls` of the shape class being tuned (t.current_shape) under `base`: (its
    problems among `probs`, why it is not tuned or None, its live cells)."""
    live = t.live_cells(cls, base)
    cell = lambda p: (problems_mod.path_of(p, base, t.amx), p.part)  # noqa: E731
    mine = timed_problems(t.spec, cls, [p for p in probs if in_class(t.spec, p, cls, base, t.amx)
                                        and cell(p) in live], cell)
    why = t.class_applies(cls, base) or (
        "its knobs change no code that runs in this build (the weight layouts it holds)" if not live
        else "no problem of this run lies in its domain" if not mine else None)
    if why is None and t.class_space(cls, base).size() <= 1:
        why = "its knobs have one value each in this run's space: nothing to choose"
    return mine, why, live


def quick_points(t: Tuner) -> list[dict]:
    """--quick: every point of every class that will be tuned, each class from the
    profile's defaults and the --space pins (what the run builds when no class adopts a
    change)."""
    out = {}
    for sc, probs in t.shape_groups().items():
        t.current_shape, base = sc, t.start_for(sc)
        for cls in t.classes:
            if class_plan(t, cls, probs, base)[1] is None:
                out.update({variant_id(k): k for k in t.class_space(cls, base).points()})
    t.current_shape = None
    return list(out.values())


def tune_shape_class(t: Tuner, sc: str, probs: list) -> dict:
    """Every knob class on the problems of one shape class, from the profile's defaults and
    the --space pins; {"shapes", "classes", "skipped", "knobs": the winners}."""
    names = list(dict.fromkeys(p.shape for p in probs))
    t.say(f"shape class {sc} ({shapes.describe(sc)}): {', '.join(names)}")
    t.current_shape = sc
    base, done, skipped = t.start_for(sc), [], []
    for cls, knobs in t.classes.items():
        t.problems, why, live = class_plan(t, cls, probs, base)
        if why:
            t.say(f"class {cls}: not tuned: {why}")
            skipped.append({"class": cls, "knobs": list(knobs), "why": why})
            continue
        missing = _uncovered(t, live, base)
        if missing:
            t.say(f"class {cls}: warning: this run's problems leave part of its domain "
                  f"unmeasured ({', '.join(missing)}); the gate still checks them")
        out = classes_mod.tune_class(t, cls, base)
        if out.get("skipped"):
            skipped.append({"class": cls, "knobs": list(knobs), "why": out["skipped"]})
            continue
        out["uncovered"] = missing
        done.append(out)
        if out["winner"]:
            base = dict(out["winner"]["knobs"])
    t.current_class = t.current_shape = None
    return {"shapes": names, "classes": done, "skipped": skipped, "knobs": base}


def run(cfg: RunConfig, host: dict | None = None) -> dict:
    """The whole pipeline; returns the summary (also written as the manifest when emitting)."""
    from tuner import gate
    from tuner.build import emit

    t0 = time.perf_counter()
    t = Tuner(cfg, host)
    try:
        t.say(f"host {t.host_id}: profile {t.profile_name}, {t.resolved.compiler.family} "
              f"{t.resolved.version}; store {t.store_path}")
        if cfg.quick:
            # a quick run's variants are few and known: compiled while the weights are
            # written, not class by class between timings
            from concurrent.futures import ThreadPoolExecutor

            from tuner.build import variants

            todo = [k for k in quick_points(t) if t.cached(k) is None]
            if todo:
                t.say(f"building the run's {len(todo)} variant(s) (what is out of date) with scons "
                      f"-j{os.cpu_count()} while the weights are written")
            t0 = time.perf_counter()
            with ThreadPoolExecutor(1) as pool:
                ahead = pool.submit(variants.build_batch, t.profile_name, todo, t.work / "variants")
                # the files the gate would time too (every dtype): written while the
                # compiler runs, not inside the gate
                from tuner import gate

                gated = [problems_mod.problem(n) for n in gate.matrix(
                    dict.fromkeys(p.shape for p in t.all_problems))]
                interleave.prepare([*t.all_problems, *gated], t.work / "weights", cfg.seed,
                                   progress=t.say)
                built = ahead.result()
            t.built.update({b.vid: b for b in built})
            if todo:
                t.say(f"built {sum(b.lib is not None for b in built)} of {len(built)} variant(s) in "
                      f"{time.perf_counter() - t0:.1f} s, the weights included")
        else:
            weights_ready(t)
        per_shape = {sc: tune_shape_class(t, sc, probs) for sc, probs in t.shape_groups().items()}
        t.problems = t.all_problems
        # the default build's shape classes (the profile's), with this run's on top
        candidate = shapes.join(t.default, {**shapes.split(t.default_assignment)[1],
                                            **{sc: r["knobs"] for sc, r in per_shape.items()}})
        summary = summary_mod.make(t, per_shape, candidate, time.perf_counter() - t0,
                                   lambda m: _current(t, m))
        if cfg.emit and summary["winner"] is not None:
            if cfg.gate:
                g = gate.run_gate(t, candidate, {sc: r["shapes"] for sc, r in per_shape.items()})
                summary_mod.with_gate(summary, t, g)
            knobs = summary["winner"]["knobs"]
            summary["wall_s"] = time.perf_counter() - t0  # the gate included
            summary["headline"] = summary_mod.headline(summary)
            summary["emitted"] = emit.emit(
                emit.Target(Path(t.cfg.build_dir), t.profile_name, t.host, t.identity, t.say),
                knobs, summary)
            summary["isa_check"] = summary["emitted"]["isa_check"]
            check = summary["isa_check"]
            if check["ok"] is False:
                t.say(f"ISA CHECK FAILED: {check['library']}: {check['message']}")
            elif check["ok"] is None:
                t.say(f"warning: ISA check {check['message']}")
        summary["headline"] = summary_mod.headline(summary)
    finally:
        t.store.close()
    if cfg.report:
        summary["report"] = _write_report(t, summary)
    return summary


def _write_report(t: Tuner, summary: dict) -> dict:
    """The report after the run: its failure is recorded in the summary, never raised,
    so the measurements (already in the store) and the emitted files stay reported."""
    from tuner import report

    out = Path(t.cfg.report_dir or reports_dir_default() / t.host_id)
    tuned = (summary.get("emitted") or {}).get("dir") or hostid.tuned_dir(t.cfg.build_dir)
    try:
        res = report.write_report(t.store_path, tuned, out)
    except Exception as exc:  # e.g. an unwritable reports/ directory
        t.say(f"report: not written: {type(exc).__name__}: {exc}")
        return {"html": None, "md": None, "errors": [f"{type(exc).__name__}: {exc}"]}
    for e in res["errors"]:
        t.say(f"report: {e}")
    t.say(f"report: {res['html']}")
    return {"html": str(res["html"]), "md": str(res["md"]), "errors": res["errors"]}


def _uncovered(t: Tuner, live: set, base: dict) -> list[str]:
    """The class's live (path, dtype) cells (Tuner.live_cells) that no problem of the run
    measures under `base`."""
    have = {(problems_mod.path_of(p, base, t.amx), p.part) for p in t.problems}
    return [f"{path}/{dtype}" for path in render.PATHS for dtype in render.DOMAIN_DTYPES
            if (path, dtype) in live and (path, dtype) not in have]

