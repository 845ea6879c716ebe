"""What a tuning run says at the end: the summary dict (the manifest keeps it) and its
printed form, led by one sentence of what tuning bought on this host.

Each problem appears once per shape class: where tuning changed its code, the default
build and the emitted candidate timed side by side by the gate (interleaved rounds at
all threads, its 95% interval), or, without a gate, the race of the last class that
adopted a change on it; elsewhere (the default's code) the default's time in the last
class that measured it. GB/s and "% of bw" use the read bandwidth recorded with those
timings.
"""
from __future__ import annotations

import os
import sys

from colibri_build import shapes
from tuner.build.signature import variant_id
from tuner.measure import problems as problems_mod


def make(t, per_shape: dict, knobs: dict, wall: float, current) -> dict:
    """The run's summary. per_shape: shape class -> {"shapes", "classes", "skipped"};
    knobs: the candidate assignment; current(m): whether a store row is this run's code."""
    summary = _make(t, per_shape, knobs, wall, current)
    _tuned(summary, t, knobs)
    return summary


def _tuned(summary: dict, t, knobs: dict) -> None:
    """Per shape class, the knob values it runs besides the base knobs, and the classes
    this run changed from the default build's (the profile's values for that class, which
    a promote may already have set, are not this run's doing)."""
    tuned = shapes.split(knobs)[1]
    for sc, r in summary["shape_classes"].items():
        r["knobs"] = tuned.get(sc, {})
        mine, dflt = shapes.for_class(knobs, sc), shapes.for_class(t.default_assignment, sc)
        changed = {k for k, v in mine.items() if dflt.get(k) != v}
        r["tuned_classes"] = [c for c, ks in t.classes.items() if changed.intersection(ks)]


def _make(t, per_shape: dict, knobs: dict, wall: float, current) -> dict:
    classes = [dict(c, shape_class=sc) for sc, r in per_shape.items() for c in r["classes"]]
    complete = all(c["winner"] for c in classes)
    failed = [m for m in t.store.query(kernel="expert_ffn", host_id=t.host_id)
              if m.status != "ok" and current(m)]
    threads = t.cfg.threads or os.cpu_count()
    return {
        "host_id": t.host_id, "profile": t.profile_name,
        "compiler": {"family": t.resolved.compiler.family, "version": t.resolved.version,
                     "path": t.resolved.compiler.path},
        "cflags": list(t.resolved.cflags), "ldflags": list(t.resolved.ldflags),
        "notes": list(t.resolved.notes),
        "shape_classes": {sc: {"shapes": r["shapes"], "sizes": shapes.describe(sc),
                               "skipped_classes": r["skipped"]}
                          for sc, r in per_shape.items()},
        "classes": classes,
        "skipped_classes": [dict(s, shape_class=sc) for sc, r in per_shape.items()
                            for s in r["skipped"]],
        "evaluations": sum(c["evaluations"] for c in classes),
        "space_size": sum(c["space_size"] for c in classes),
        "strategy": ",".join(sorted({c["strategy"] for c in classes})) or "none",
        "measured_this_run": t.measured, "from_store": t.from_store,
        "registry": str(t.cfg.registry) if t.cfg.registry else None,
        "threads": threads, "seed": t.cfg.seed, "min_seconds": t.cfg.min_seconds,
        "default": {"knobs": t.default_assignment},
        "winner": _winner(t, knobs) if complete else None,
        "rows": _rows(race_rows(classes), classes),
        "failed": [{"vid": variant_id(m.knobs), "problem": m.problem, "status": m.status,
                    "reason": m.reason[:500]} for m in failed],
        "wall_s": wall, "store": str(t.store_path), "read_bandwidth_gbps": t.read_bandwidth(),
    }


def _winner(t, knobs: dict) -> dict:
    return {"knobs": knobs, "vid": variant_id(knobs),
            "is_default": variant_id(knobs) == variant_id(t.default_assignment)}


def with_gate(summary: dict, t, gate: dict) -> dict:
    """The summary after the gate: the knobs it emits, and its cells as the rows."""
    knobs = gate["knobs"]
    summary["gate"] = gate
    summary["winner"] = _winner(t, knobs)
    _tuned(summary, t, knobs)
    if gate.get("cells"):
        summary["rows"] = _rows(gate_rows(gate, summary["threads"]), summary["classes"])
    return summary


def gate_rows(gate: dict, threads: int) -> list[dict]:
    """One row per problem the gate timed at `threads`: default and tuned seconds from the
    same interleaved rounds."""
    rows = []
    for c in gate.get("cells", []):
        if c.get("status") != "ok" or c["threads"] != threads:
            continue
        # the bandwidth of the same rounds (older records: the run's probe)
        bw = c.get("read_bandwidth_gbps") or gate.get("read_bandwidth_gbps")
        p = problems_mod.problem(c["problem"])
        tuned = c["candidate_s"]
        gbps = p.decode_bytes / tuned / 1e9 if p.T == 1 else None
        rows.append({"problem": p.name, "shape_class": c.get("shape_class"),
                     "class": ",".join(c.get("owners") or ()) or "-", "source": "gate",
                     "default_s": c["default_s"], "tuned_s": tuned, "speedup": c["median"],
                     "interval": [c["lo"], c["hi"]], "rounds": c.get("rounds"),
                     "kept_default": False, "gbps": gbps, "read_bandwidth_gbps": bw,
                     "bw_fraction": (gbps / bw) if gbps and bw else None,
                     "gflops": p.flops / tuned / 1e9})
    return rows


def race_rows(classes: list[dict]) -> list[dict]:
    """Without a gate: per shape class and problem, the race of the last class that adopted
    a change on it (its default and winner from the same rounds)."""
    rows = {}
    for c in classes:
        w = c["winner"]
        if not w or w.get("is_default"):
            continue
        dflt = next((r for r in c["finalists"] if r["is_default"]), None)
        bw = c.get("read_bandwidth_gbps")
        for i, name in enumerate(c["problems"]):
            p = problems_mod.problem(name)
            tuned = w["per_problem"][i]
            base = dflt["per_problem"][i] if dflt else None
            gbps = p.decode_bytes / tuned / 1e9 if p.T == 1 else None
            iv = ((w.get("verdict") or {}).get("per_problem") or {}).get(name)
            rows[(c.get("shape_class"), name)] = {
                "problem": name, "shape_class": c.get("shape_class"), "class": c["class"],
                "source": "race", "default_s": base, "tuned_s": tuned,
                "speedup": (base / tuned) if base else None,
                "interval": [iv["lo"], iv["hi"]] if iv else None, "rounds": len(w["rounds"][i]),
                "kept_default": False, "gbps": gbps, "read_bandwidth_gbps": bw,
                "bw_fraction": (gbps / bw) if gbps and bw else None,
                "gflops": p.flops / tuned / 1e9}
    return list(rows.values())


def kept_rows(classes: list[dict], done: set) -> list[dict]:
    """One row per (shape class, problem) not in `done` (the rows that show a change): the
    default's time in the last class that measured it, nothing to compare it with."""
    rows = {}
    for c in classes:
        dflt = next((r for r in c.get("finalists") or [] if r["is_default"]), None)
        if dflt is None:
            continue
        bw = c.get("read_bandwidth_gbps")
        for i, name in enumerate(c["problems"]):
            if (c.get("shape_class"), name) in done:
                continue
            p = problems_mod.problem(name)
            s = dflt["per_problem"][i]
            gbps = p.decode_bytes / s / 1e9 if p.T == 1 else None
            rows[(c.get("shape_class"), name)] = {
                "problem": name, "shape_class": c.get("shape_class"), "class": "-",
                "source": "default", "default_s": s, "tuned_s": s, "speedup": None,
                "interval": None, "rounds": len(dflt["rounds"][i]), "kept_default": True,
                "gbps": gbps, "read_bandwidth_gbps": bw,
                "bw_fraction": (gbps / bw) if gbps and bw else None,
                "gflops": p.flops / s / 1e9}
    return list(rows.values())


def _rows(changed: list[dict], classes: list[dict]) -> list[dict]:
    """The rows that show a change, then the default's rows of every other problem."""
    return changed + kept_rows(classes, {(r["shape_class"], r["problem"]) for r in changed})


def headline(summary: dict) -> str:
    """One sentence: what tuning bought on this host, per shape class, and where it kept
    the defaults."""
    parts = []
    rows = summary.get("rows") or []
    for sc, r in (summary.get("shape_classes") or {}).items():
        who = f"{', '.join(r['shapes'])} (shape class {sc})"
        adopted = r.get("tuned_classes") or []
        if not adopted:
            parts.append(f"{who}: the defaults were kept (no knob class was faster beyond noise)")
            continue
        mine = [x for x in rows if x.get("shape_class") == sc and x.get("speedup")]
        gain = ""
        if mine:
            lo, hi = min(x["speedup"] for x in mine), max(x["speedup"] for x in mine)
            paths = sorted({problems_mod.path_of(problems_mod.problem(x["problem"])) for x in mine})
            span = f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"
            gain = (f" {span} on its {'/'.join(paths)} cells"
                    f" ({mine[0]['source']} medians)")
        parts.append(f"{who}: tuned {', '.join(adopted)},{gain} and the defaults elsewhere")
    if not parts:
        return "Nothing was tuned."
    return ("Tuning on this host: " + "; ".join(parts)
            + ". Layers of any other shape run the profile's defaults.")


def print_summary(summary: dict, out=None) -> None:
    out = out or sys.stdout  # looked up at call time: stdout may have been replaced
    w = summary.get("winner")
    print(f"\n{headline(summary)}", file=out)
    print(f"host {summary['host_id']}  profile {summary['profile']}  "
          f"strategy {summary['strategy']}  evaluated {summary['evaluations']} of "
          f"{summary['space_size']} (measured {summary['measured_this_run']} this run)  "
          f"{summary['wall_s']:.0f} s", file=out)
    if not w:
        print("no variant passed verification: nothing emitted", file=out)
        return
    for c in summary.get("skipped_classes") or []:
        print(f"  class {c['class']}: not tuned: {c['why']}", file=out)
    for c in summary["classes"]:
        cw = c.get("winner") or {}
        v = cw.get("verdict")
        mine = ",".join(f"{k}={cw['knobs'][k]}" for k in c.get("knobs", []) if cw and k in cw["knobs"])
        what = (f"adopted {mine}, {v['overall']['median']:.3f}x "
                f"[{v['overall']['lo']:.3f}, {v['overall']['hi']:.3f}] over its default"
                if v and not cw.get("is_default") else "kept its default" if cw else "no winner")
        same = len(c.get("same_code_as_default") or ())
        print(f"  {c.get('shape_class', '')} class {c['class']}: {c['strategy']}, {c['evaluations']} of "
              f"{c['space_size']} variant(s) evaluated"
              + (f" ({same} with the default's machine code, not timed)" if same else "")
              + f"; {what}", file=out)
    rows = summary["rows"]
    if rows:
        src = {r.get("source") for r in rows} - {"default"}
        how = ("changed ones from the gate's interleaved rounds, default and tuned side by side"
               if src == {"gate"} else "changed ones from each class's race, default and winner "
               "side by side" if src else "nothing changed: the default's times")
        print(f"per problem ({how}; the others at the default's code, one measurement each):",
              file=out)
        print(f"{'shape class':12} {'problem':32} {'default':>11} {'tuned':>11} {'speed-up':>8} "
              f"{'95% interval':>15} {'GB/s':>7} {'% of bw':>8}", file=out)
        for r in rows:
            d = f"{r['default_s'] * 1e3:.3f} ms" if r["default_s"] else "-"
            sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
            iv = (f"[{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]" if r.get("interval")
                  else "(the default's code)" if r.get("kept_default") else "-")
            g = f"{r['gbps']:.1f}" if r["gbps"] else "-"
            f = f"{100 * r['bw_fraction']:.0f}%" if r["bw_fraction"] else "-"
            print(f"{r.get('shape_class') or '-':12} {r['problem']:32} {d:>11} "
                  f"{r['tuned_s'] * 1e3:8.3f} ms {sp:>8} {iv:>15} {g:>7} {f:>8}", file=out)
    gate = summary.get("gate")
    if gate:
        from tuner.gate import print_gate
        print_gate(gate, out)
    bws = sorted({round(r["read_bandwidth_gbps"], 1) for r in rows if r.get("read_bandwidth_gbps")})
    if bws:
        print(f"(% of bw: decode weight bytes per second over the read bandwidth measured in "
              f"the same rounds, {bws[0]:.1f}-{bws[-1]:.1f} GB/s)", file=out)
    if summary["failed"]:
        print(f"{len(summary['failed'])} failed measurement(s) recorded (see the manifest)", file=out)
    if summary.get("emitted"):
        print(f"emitted: {summary['emitted']['dir']}", file=out)
    check = summary.get("isa_check")
    if check:
        verdict = {True: "ok", False: "FAILED", None: "not checked"}[check["ok"]]
        print(f"ISA check {verdict}: {check['message']}", file=out)
    rep = summary.get("report")
    if rep and rep.get("html"):
        print(f"report: {rep['html']}" + (f" ({len(rep['errors'])} plot(s) failed)"
                                          if rep["errors"] else ""), file=out)
