"""The storage class: the runtime read knobs of a model under a memory budget
(colibri_load_options' io_threads, read_depth, direct_io and policy; their domains in
tuner/storage.knobs.yaml), tuned on a recorded routing trace by the kernel classes' rules.

    python -m tuner storage [--model FILE | --shape S --dtype D --layers N] [--trace F.npy]
                            [--share 0.25] [--decode 32] [--prefill 128] [--quick] ...

1. The trace: the hidden states entering the first layer, [T, hidden] float32 (--trace, for
   example recorded from a real model's run), or seeded normal tokens. The model's routers
   turn it into the routing trace; every candidate replays the same one, so each meets the
   same experts in the same order. Its first `decode` rows run a call each (the decode
   cell), the next `prefill` rows one call (the prefill cell).
2. Each run: kernels/tools/infer_model.c (tuner/measure/infer_tool.py) in a fresh memory
   cgroup limited to `share` x the file's size, the budget that limit less a margin, with
   the file's pages dropped from the page cache first; its cost is the calls' seconds per
   token. A run whose outputs are not the bits of the unbudgeted run, that fails or is
   killed, puts its candidate out.
3. Screening, knob by knob in the knobs file's order: each value (--quick: the quick ones)
   run once with the other knobs at the best values so far.
4. The race: the `finalists` best screened points and the default in interleaved rounds
   (interleave.run_rounds with interleave.race_rule), then decide.verdict: a point replaces
   the default only when its interval lies above 1 and no cell is slower.
5. The winner's settings go to build/storage/<host-id>.json (colibri.storage_settings), which
   Model.load applies to budgeted models on this host, and the whole record to
   reports/<host-id>/storage.json.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import yaml

from colibri import _cli
from tuner import decide
from tuner.measure import interleave
from tuner.measure.budget_runs import RunFailed
from tuner.measure.worker import round_order

KNOBS_FILE = Path(__file__).with_name("storage.knobs.yaml")
MARGIN = 32 << 20  # the limit less the budget: the library, its threads, activations, scratch


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple
    default: object
    quick: tuple
    doc: str


def load_knobs(path: Path = KNOBS_FILE) -> list[Knob]:
    """The storage class's knobs, in tuning order; ValueError naming a malformed entry."""
    from colibri.storage_settings import RANGES

    raw = yaml.safe_load(Path(path).read_text())["knobs"]
    out = []
    for name, k in raw.items():
        if name not in RANGES:
            raise ValueError(f"{path}: {name} is not a read option (one of {', '.join(RANGES)})")
        values, quick = tuple(k["values"]), tuple(k.get("quick") or ())
        if k["default"] not in values or not set(quick) <= set(values):
            raise ValueError(f"{path}: {name}'s default and quick values must be among its values {list(values)}")
        out.append(Knob(name, values, k["default"], quick, k.get("doc", "")))
    return out


def defaults(knobs: Sequence[Knob]) -> dict:
    return {k.name: k.default for k in knobs}


def label(point: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def options(point: dict) -> dict:
    """A point as colibri_load_options values (the policy's name as its number)."""
    from colibri.storage_settings import POLICIES

    return {k: POLICIES.index(v) + 1 if k == "policy" else int(v) for k, v in point.items()}


# measure(point, cell) -> seconds per token; raises RunFailed
Measure = Callable[[dict, str], float]


def cost(measure: Measure, point: dict, cells: Sequence[str]) -> tuple[float, str | None]:
    """Geometric mean over the cells of one run's seconds per token, and None; (inf, why) when
    a run failed."""
    logs = []
    for c in cells:
        try:
            logs.append(math.log(measure(point, c)))
        except RunFailed as e:
            return math.inf, f"{c}: {e}"
    return math.exp(sum(logs) / len(logs)), None


def screen(knobs: Sequence[Knob], cells: Sequence[str], measure: Measure, *, quick: bool,
           say=print) -> list[dict]:
    """Knob by knob, each value once beside the best values so far: [{point, cost}] in the
    order run (the default first)."""
    best = defaults(knobs)
    seen: dict[str, dict] = {}

    def run(point):
        key = label(point)
        if key not in seen:
            c, why = cost(measure, point, cells)
            seen[key] = {"point": dict(point), "cost": c, **({"failed": why} if why else {})}
            say(f"  screen {key}: " + (f"{c * 1e3:.2f} ms/token" if why is None else f"failed ({why})"))
        return seen[key]["cost"]

    run(best)
    for k in knobs:
        values = [best[k.name], *(v for v in (k.quick if quick else k.values) if v != best[k.name])]
        costs = {v: run({**best, k.name: v}) for v in values}
        best = {**best, k.name: min(values, key=lambda v: costs[v])}
    return list(seen.values())


class RaceSession:
    """Rounds of runs for interleave.run_rounds: every live point once on every cell, in
    rotating order; a point whose run fails is out (its reason in `failed`)."""

    def __init__(self, points: list[dict], cells: Sequence[str], measure: Measure, say=print):
        self.points, self.cells, self.measure, self.say = points, list(cells), measure, say
        self.failed: dict[int, str] = {}
        self.rounds_done = 0

    def round(self, live) -> dict:
        out = {(c, 0): [None] * len(self.points) for c in self.cells}
        for c in self.cells:
            for i in round_order([i for i in live if i not in self.failed], self.rounds_done):
                try:
                    out[(c, 0)][i] = self.measure(self.points[i], c)
                except RunFailed as e:
                    self.failed[i] = str(e)
        self.rounds_done += 1
        self.say(f"  race round {self.rounds_done}: {len(live)} point(s), ms/token "
                 + "; ".join(f"{c} " + " ".join("-" if v is None else f"{v * 1e3:.2f}" for v in out[(c, 0)])
                             for c in self.cells))
        return out


def race(points: list[dict], cells: Sequence[str], measure: Measure, *, rounds=(3, 8),
         budget_s: float | None = None, say=print) -> dict:
    """points[0] (the default) against the others in interleaved rounds; per candidate its
    decide.verdict, and the winner: the adopted one with the highest median ratio, else the
    default."""
    res = interleave.Interleaved(libs=[label(p) for p in points], cells=[(c, 0) for c in cells])
    res.seconds = {c: [[] for _ in points] for c in res.cells}
    res.live = list(range(len(points)))
    session = RaceSession(points, cells, measure, say)
    rule = interleave.race_rule(0, list(cells))

    def step(r):
        r.live = [i for i in r.live if i not in session.failed]
        if 0 not in r.live:
            return None
        return rule(r) if len(r.live) > 1 else None

    t0 = time.monotonic()
    interleave.run_rounds(session, res, rounds=rounds, step=step, budget_s=budget_s)
    out = {"rounds": res.rounds, "wall_s": time.monotonic() - t0, "dropped": dict(res.dropped),
           "failed": {label(points[i]): why for i, why in session.failed.items()},
           "seconds": {c: res.seconds[(c, 0)] for c in cells}, "candidates": []}
    if 0 in session.failed:
        raise RunFailed(f"the default failed: {session.failed[0]}")
    winner, best = points[0], None
    for i, p in enumerate(points[1:], 1):
        if i in session.failed:
            out["candidates"].append({"point": p, "failed": session.failed[i]})
            continue
        d, c = res.common([0, i])
        v = decide.verdict(d, c, list(cells))
        o = v["overall"]
        why = ("adopted" if v["adopt"] else f"slower on {', '.join(v['slower'])}" if v["slower"]
               else "not faster beyond noise")
        say(f"  {label(p)}: {o.text()} over the default ({o.rounds} rounds): {why}")
        out["candidates"].append({"point": p, "overall": o.to_dict(), "adopt": v["adopt"], "slower": v["slower"],
                                  "per_cell": {n: r.to_dict() for n, r in v["per_problem"].items()}})
        if v["adopt"] and (best is None or o.median > best):
            winner, best = p, o.median
    out["winner"] = winner
    return out


def tune(knobs: Sequence[Knob], cells: Sequence[str], measure: Measure, *, quick: bool = False,
         finalists: int = 3, rounds=(3, 8), budget_s: float | None = None, say=print) -> dict:
    """Screen, then race the best `finalists` screened points against the default."""
    dflt = defaults(knobs)
    say(f"screening {', '.join(k.name for k in knobs)} knob by knob on {', '.join(cells)}")
    screened = screen(knobs, cells, measure, quick=quick, say=say)
    if not math.isfinite(screened[0]["cost"]):
        raise RunFailed("the default's run failed: nothing to compare against")
    ranked = sorted((s for s in screened[1:] if math.isfinite(s["cost"])), key=lambda s: s["cost"])
    finals = [dflt, *(s["point"] for s in ranked[:finalists])]
    say(f"racing {len(finals) - 1} point(s) against the default, {rounds[0]}-{rounds[1]} interleaved rounds")
    raced = race(finals, cells, measure, rounds=rounds, budget_s=budget_s, say=say) if len(finals) > 1 else \
        {"rounds": 0, "candidates": [], "winner": dflt}
    kept = raced["winner"] == dflt
    say("storage: keeps the default (no point faster beyond noise on every cell)" if kept
        else f"storage: adopts {label(raced['winner'])}")
    return {"knobs": [k.name for k in knobs], "default": dflt, "screen": screened, "race": raced,
            "winner": raced["winner"], "adopted": not kept}


# ---------------------------------------------------------------- the command

def add_command(sub) -> None:
    p = sub.add_parser("storage", help="tune a budgeted model's read settings (I/O threads, read depth, "
                       "O_DIRECT, eviction policy) on a routing trace, cold, under a memory cgroup",
                       description=__doc__.split("\n\n")[0] + " Runs each point cold in a memory cgroup "
                       "(root: v2 memory.max or v1 memory.limit_in_bytes) and writes the winner where "
                       "Model.load finds it.",
                       epilog="Exit status: 0 done (the default kept or a point adopted); 1 a run of the "
                       "default failed; 2 usage, or no memory cgroup here.")
    p.add_argument("--model", metavar="FILE", help="the model file (default: a generated one, --shape/--dtype/"
                   "--layers)")
    p.add_argument("--shape", default="qwen3-30b-a3b", help="shape of the generated model (default qwen3-30b-a3b)")
    p.add_argument("--dtype", default="int4", choices=["f32", "bf16", "int8", "int4", "int4g32"],
                   help="weight dtype of the generated model (default int4)")
    p.add_argument("--layers", type=_cli.positive_int, default=4, help="layers of the generated model (default 4)")
    p.add_argument("--trace", metavar="FILE", help="the hidden states entering the first layer, [tokens, hidden] "
                   "float32 (.npy, or raw float32): the routing trace (default: seeded normal tokens)")
    p.add_argument("--share", type=_cli.fraction, default=0.25, help="the cgroup's limit as a share of the file (default "
                   "0.25); the budget is the limit less --margin-mib")
    p.add_argument("--decode", type=_cli.count, default=32, help="trace rows run one call each (default 32)")
    p.add_argument("--prefill", type=_cli.count, default=128, help="trace rows after those, run in one call "
                   "(default 128; 0: no prefill cell)")
    p.add_argument("--quick", action="store_true", help="each knob's quick values only")
    p.add_argument("--finalists", type=_cli.positive_int, default=3, help="screened points raced (default 3)")
    p.add_argument("--rounds", default="3,8", metavar="LO,HI", help="race rounds before the first decision, and "
                   "the most (default 3,8)")
    p.add_argument("--budget-s", type=_cli.positive_float, default=900.0, help="the race stops after this many seconds "
                   "(default 900)")
    p.add_argument("--threads", type=_cli.positive_int, default=None, help="compute threads (default: all CPUs)")
    p.add_argument("--margin-mib", type=_cli.positive_int, default=MARGIN >> 20,
                   help=f"the limit less the budget (default {MARGIN >> 20})")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated trace (default 0)")
    p.add_argument("--out", metavar="FILE", help="the record (default reports/<host-id>/storage.json)")
    p.add_argument("--settings", metavar="FILE", help="where the winner goes (default build/storage/<host-id>.json, "
                   "which Model.load reads)")
    p.add_argument("--no-settings", action="store_true", help="measure and report, but write no settings")
    p.set_defaults(func=cmd)


def load_trace(path: Path, hidden: int) -> np.ndarray:
    """A trace file as [tokens, hidden] float32; ValueError saying what is wrong."""
    import numpy as np

    try:
        a = np.load(path, allow_pickle=False) if path.suffix == ".npy" else np.fromfile(path, np.float32)
    except (OSError, ValueError) as e:
        raise ValueError(f"--trace {path}: cannot read it ({e})") from None
    if path.suffix != ".npy":
        if a.size % hidden:
            raise ValueError(f"--trace {path}: {a.size} float32 values are not rows of the model's {hidden}")
        a = a.reshape(-1, hidden)
    if a.ndim != 2 or a.shape[1] != hidden:
        raise ValueError(f"--trace {path}: shape {a.shape}, not [tokens, {hidden}]")
    a = np.ascontiguousarray(a, np.float32)
    if not np.isfinite(a).all():
        raise ValueError(f"--trace {path}: holds NaN or Inf")
    return a


def cmd(args) -> int:
    import hashlib
    import os
    import sys

    import numpy as np

    from colibri._lib import default_library_path
    from colibri.modelfile import DTYPE_NAMES, expert_payload_bytes, read_header
    from colibri_build import hostid, render
    from colibri_build.paths import build_dir_default, reports_dir_default
    from tuner.measure import budget_runs, cgroup, infer_tool

    def usage(msg: str) -> int:
        print(f"python -m tuner storage: error: {msg}", file=sys.stderr)
        return _cli.EXIT_USAGE

    try:
        lo, hi = (int(v) for v in args.rounds.split(","))
        if not 1 <= lo <= hi:
            raise ValueError
    except ValueError:
        return usage(f"--rounds {args.rounds!r}: want LO,HI with 1 <= LO <= HI")
    if not args.decode + args.prefill:
        return usage("--decode 0 and --prefill 0 leave nothing to run")
    try:
        cgroup.cgroup_root()
    except cgroup.NoCgroup as e:
        return usage(f"needs a memory cgroup: {e}")
    say = print
    if args.model:
        model = Path(args.model)
        if not model.is_file():
            return usage(f"--model {model}: no such file")
    else:
        from tuner.measure import problems, weights

        if args.shape not in problems.SHAPES:
            return usage(f"--shape {args.shape}: one of {', '.join(sorted(problems.SHAPES))}")
        model = weights.ensure_model(build_dir_default() / "tuner" / "weights",
                                     problems.problem(f"{args.shape}/decode/{args.dtype}"), copies=args.layers,
                                     progress=say)
    try:
        hdr = read_header(model)
    except (OSError, ValueError) as e:
        return usage(f"{model}: not a model file ({e})")
    H, size = hdr["hidden"], model.stat().st_size
    rows = args.decode + args.prefill
    if args.trace:
        try:
            trace = load_trace(Path(args.trace), H)
        except ValueError as e:
            return usage(str(e))
        if len(trace) < rows:
            return usage(f"--trace {args.trace}: {len(trace)} rows, under the {rows} --decode and --prefill run")
        source = str(args.trace)
    else:
        trace = np.random.default_rng(args.seed).standard_normal((rows, H), dtype=np.float32)
        source = f"seeded normal tokens (seed {args.seed})"
    limit = int(args.share * size)
    budget = limit - (args.margin_mib << 20)
    if budget <= 0:
        return usage(f"--share {args.share}: a limit of {limit} bytes leaves nothing past the margin")
    cells = {name: span for name, span in (("decode", (0, args.decode)), ("prefill", (args.decode, args.prefill)))
             if span[1]}
    threads = args.threads or os.cpu_count() or 1
    lib = default_library_path().resolve()
    work = build_dir_default() / "tuner" / "storage"
    work.mkdir(parents=True, exist_ok=True)
    exe = infer_tool.compile_tool(lib, work / "infer_model")
    say(f"storage: {model} ({DTYPE_NAMES[hdr['weight_dtype']]}, {size / 1e9:.2f} GB) under a {limit >> 20} MiB "
        f"limit ({args.share:g} of the file), budget {budget >> 20} MiB "
        f"({budget / expert_payload_bytes(hdr):.0%} of the experts), {threads} threads; {lib}")
    runs = budget_runs.BudgetRuns(exe=exe, model=model, trace=trace, cells=cells, limit=limit, budget=budget,
                                  threads=threads, work=work, options=options)
    knobs = load_knobs()
    t0 = time.monotonic()
    try:
        result = tune(knobs, list(cells), runs, quick=args.quick, finalists=args.finalists, rounds=(lo, hi),
                      budget_s=args.budget_s, say=say)
    except RunFailed as e:
        print(f"python -m tuner storage: {e}", file=sys.stderr)
        return 1
    cpu = hostid.host_id()
    rec = {"host_id": cpu, "library": str(lib), "model": str(model), "file_bytes": size,
           "dtype": DTYPE_NAMES[hdr["weight_dtype"]], "share": args.share, "limit": limit, "budget": budget,
           "budget_share_of_experts": budget / expert_payload_bytes(hdr), "threads": threads,
           "trace": {"source": source, "rows": rows, "sha256": hashlib.sha256(trace[:rows].tobytes()).hexdigest()},
           "cells": {k: {"first_row": v[0], "tokens": v[1]} for k, v in cells.items()},
           "quick": args.quick, "wall_s": time.monotonic() - t0, "runs": runs.log, **result}
    print(table(rec))
    out = Path(args.out) if args.out else reports_dir_default() / cpu / "storage.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    render.atomic_write(out, json.dumps(rec, indent=1, default=str))
    say(f"wrote {out}")
    if not args.no_settings:
        dst = Path(args.settings) if args.settings else hostid.storage_settings_path(build_dir_default())
        dst.parent.mkdir(parents=True, exist_ok=True)
        render.atomic_write(dst, json.dumps({"settings": result["winner"], "adopted": result["adopted"],
                                             "tuned_on": {k: rec[k] for k in ("model", "dtype", "share", "budget",
                                                                              "threads", "trace")},
                                             "record": str(out)}, indent=1))
        say(f"wrote {dst}: Model.load(memory_budget=...) on this host reads with {label(result['winner'])}")
    return 0


def table(rec: dict) -> str:
    """The screened points and the race's verdicts, as Markdown."""
    cells = list(rec["cells"])
    lines = [f"screening ({rec['dtype']}, limit {rec['limit'] >> 20} MiB, budget "
             f"{rec['budget_share_of_experts']:.0%} of the experts; one cold run each, ms per token, geometric mean "
             f"of {', '.join(cells)})", "| point | ms/token |", "| --- | --- |"]
    for s in rec["screen"]:
        c = s["cost"]
        lines.append(f"| {label(s['point'])} | {c * 1e3:.2f} |" if math.isfinite(c) else f"| {label(s['point'])} | "
                     f"failed: {s.get('failed', '')[:100]} |")
    race = rec["race"]
    lines += ["", f"race ({race['rounds']} interleaved rounds; ratio = default / point seconds, > 1 faster)",
              "| point | ratio [95% interval] | " + " | ".join(cells) + " | verdict |",
              "| --- | --- | " + " | ".join("---" for _ in cells) + " | --- |"]
    for c in race["candidates"]:
        if "failed" in c:
            lines.append(f"| {label(c['point'])} | failed: {c['failed'][:80]} |" + " |" * (len(cells) + 1))
            continue
        o = c["overall"]
        per = " | ".join(f"{c['per_cell'][n]['median']:.3f}x" for n in cells)
        verdict = "adopted" if c["adopt"] else (f"slower on {', '.join(c['slower'])}" if c["slower"] else "tie")
        lines.append(f"| {label(c['point'])} | {o['median']:.3f}x [{o['lo']:.3f}, {o['hi']:.3f}] | {per} | {verdict} |")
    lines += ["", f"winner: {label(rec['winner'])}" + ("" if rec["adopted"] else " (the default)")]
    return "\n".join(lines)
