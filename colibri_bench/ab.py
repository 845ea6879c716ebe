"""python -m colibri_bench ab LIB_A LIB_B: two builds of the engine side by side, interleaved
(tuner/measure/interleave.py, the tuner's own comparison), on every case of the shapes,
phases, dtypes and thread counts given; per case the median seconds of each, the speed
ratio A/B (> 1: B is faster) and its 95% interval (tuner/decide.py), and for decode B's GB/s
and its share of the read bandwidth. For comparing a build with another tree's (a release, a
commit before a change) or with a tuned library. B is verified against the NumPy
reference first; A is trusted.

The read bandwidth is measured at the start of every round (0.1 s at each thread count), so
each round's decode time is set against the better of the two readings around it: on a
shared machine whose memory moves between slow and fast windows within seconds, a figure
from the start of a run misjudges the rounds that ran in the other window. `% bw` is the
median of those paired shares; a last table gives, apart for the rounds of fast and of slow
windows (judged against the best reading of the whole run at that thread count,
colibri_bench/windows.py; with their counts), every case's median A/B ratio, and for decode
B's and A's shares: many short rounds (`--rounds 100 --min-seconds 0.15`) catch both.

Writes the table to stdout and every round to JSON (--out, default
reports/<host-id>/ab.json)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from colibri import _cli, quant
from colibri_build import hostid
from colibri_build.paths import build_dir_default, reports_dir_default
from colibri_bench import windows
from tuner import decide
from tuner.measure import interleave, problems as problems_mod

PHASES = ("decode", "prefill128", "prefill512")


def main(argv=None) -> int:
    ap = _cli.Parser(prog="python -m colibri_bench ab", description=__doc__.split("\n\n")[0],
                     epilog="Exit status: 0 done, 1 a measurement failed, 2 usage error.")
    ap.add_argument("lib_a", metavar="LIB_A", help="the reference libcolibri.so")
    ap.add_argument("lib_b", metavar="LIB_B", help="the libcolibri.so set against it")
    ap.add_argument("--shape", action="append", help="shape (repeatable; default qwen3-30b-a3b)")
    ap.add_argument("--phase", action="append", help=f"repeatable; default {', '.join(PHASES)}")
    ap.add_argument("--dtype", action="append", choices=list(quant.DTYPES),
                    help="repeatable; default all")
    ap.add_argument("--threads", action="append", type=_cli.positive_int,
                    help="repeatable; default 1 and all CPUs")
    ap.add_argument("--rounds", type=_cli.positive_int, default=8, help="interleaved rounds (default 8)")
    ap.add_argument("--min-seconds", type=_cli.positive_float, default=0.2,
                    help="timing per library, case and round (default 0.2)")
    ap.add_argument("--out", help="JSON output (default reports/<host-id>/ab.json)")
    args = ap.parse_args(argv)
    for lib in (args.lib_a, args.lib_b):
        if not Path(lib).is_file():
            ap.error(f"no library at {lib}")
    try:
        probs = [problems_mod.problem(f"{s}/{ph}/{d}")
                 for s in args.shape or ["qwen3-30b-a3b"] for ph in args.phase or PHASES
                 for d in args.dtype or quant.DTYPES]
    except ValueError as exc:
        ap.error(str(exc))
    threads = sorted(set(args.threads or {1, os.cpu_count() or 1}))
    wdir = build_dir_default() / "tuner" / "weights"
    from colibri._lib import open_library

    from colibri_bench.bench import read_bandwidth
    from tuner.host.bandwidth import _llc_total_here, working_set_bytes

    lib = open_library(args.lib_a)
    nbytes = working_set_bytes(_llc_total_here())[0]
    rows, failed = [], False
    print(f"{'case':34} {'thr':>3} {'A ms':>9} {'B ms':>9} {'A/B':>6} {'95% interval':>16} "
          f"{'B GB/s':>7} {'% bw':>5}", flush=True)
    for shape_dtype in dict.fromkeys((p.shape, p.dtype) for p in probs):
        group = [p for p in probs if (p.shape, p.dtype) == shape_dtype]
        res = interleave.interleave([args.lib_a, args.lib_b], group, threads=threads,
                                    weights_dir=wdir, rounds=(args.rounds, args.rounds),
                                    min_seconds=args.min_seconds, verify=[False, True], bandwidth=True,
                                    say=lambda m: print(m, file=sys.stderr, flush=True))
        v = res.verified[1] if res.verified else None
        if not res.ok or (v and v.get("status") != "ok"):
            why = res.reason if not res.ok else f"{v['status']}: {v.get('reason', '')}"
            print(f"{'/'.join(shape_dtype)}: {why[:300]}", flush=True)
            failed = True
            continue
        # each round's readings: its own and the next round's (the last round: a reading after it)
        bws = {th: list(res.bandwidth.get(th, [])) + [read_bandwidth(lib, th, nbytes)] for th in threads}
        for name, th in res.cells:
            a, b = res.seconds[(name, th)]
            r = decide.ratio([x / y for x, y in zip(a, b)])
            p = problems_mod.problem(name)
            gbps = p.decode_bytes / decide._median(b) / 1e9 if p.T == 1 else None
            win = windows.summary([p.decode_bytes / x / 1e9 for x in b], bws[th]) if p.T == 1 else None
            row = {"case": name, "threads": th, "a_s": decide._median(a), "b_s": decide._median(b),
                   "ratio": r.to_dict(), "b_gbps": gbps, "read_bw_gbps": win and win["best_gbps"],
                   "b_bw_fraction": win and win["all"], "rounds_a": a, "rounds_b": b,
                   "read_bw_rounds": bws[th]}
            rows.append(row)
            g = f"{gbps:.1f}" if gbps else "-"
            f = f"{100 * win['all']:.0f}%" if win and win["all"] else "-"
            print(f"{name:34} {th:>3} {row['a_s'] * 1e3:9.3f} {row['b_s'] * 1e3:9.3f} "
                  f"{r.median:6.3f} [{r.lo:6.3f}, {r.hi:6.3f}] {g:>7} {f:>5}", flush=True)
    print_windows(rows)
    out = Path(args.out) if args.out else reports_dir_default() / hostid.host_id() / "ab.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"lib_a": args.lib_a, "lib_b": args.lib_b, "rows": rows,
                               "rounds": args.rounds, "min_seconds": args.min_seconds}, indent=1))
    print(f"written: {out}")
    return 1 if failed else 0


def print_windows(rows: list) -> None:
    """By window (fast and slow, judged against the run's best reading at each thread count):
    every case's median A/B ratio (a change can win in one window and not the other), and for
    decode B's and A's share of the read bandwidth; into each row's "ratio_windows",
    "windows" and "windows_a"."""
    best = {}
    for row in rows:
        best[row["threads"]] = max([best.get(row["threads"], 0.0)] + [x for x in row["read_bw_rounds"] if x])
    lines = []
    for row in rows:
        p, th = problems_mod.problem(row["case"]), row["threads"]
        rw = row["ratio_windows"] = windows.values_by_window(
            [a / b for a, b in zip(row["rounds_a"], row["rounds_b"])], row["read_bw_rounds"], best[th])
        ratio = lambda k: f"{rw[k]:.3f} (n={rw[k + '_rounds']})" if rw[k] is not None else "- (n=0)"
        line = f"{row['case']:34} {th:>3} A/B fast {ratio('fast')}, slow {ratio('slow')}"
        if p.T == 1:
            for key, times in (("windows", row["rounds_b"]), ("windows_a", row["rounds_a"])):
                row[key] = windows.summary([p.decode_bytes / x / 1e9 for x in times], row["read_bw_rounds"], best[th])
            line += f"; % bw B {windows.text(row['windows'])}; A {windows.text(row['windows_a'])}"
        lines.append(line)
    if lines:
        print(f"by window (fast: both readings around a round at least {windows.FAST:.0%} of the run's "
              f"best at its thread count, slow: both under {windows.SLOW:.0%}; best "
              + ", ".join(f"{v:.1f} GB/s at {t}" for t, v in sorted(best.items())) + "):", flush=True)
        print("\n".join(lines), flush=True)
