"""python -m tuner: probe the host, tune the kernels, emit config.h + libcolibri.so.

Commands: probe, profiles, run, replay, report, ci, check, promote, merge, verify, storage (bench and soak are in
`python -m colibri_bench`).
`python -m tuner COMMAND --help` for each. Exit status: 0 success; 1 the command
failed (message on stderr); 2 usage error; 3 the results store is locked by another
run; 4 (check) the artifact was made for another host or toolchain.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from colibri import _cli
from colibri_build import hostid
from colibri_build.paths import build_dir_default, reports_dir_default
from tuner import cli, storage
from tuner.fleet import check, ci, promote, verify
from tuner.host import commands as host_commands
from tuner.store import registry


def _cmd_run(args: argparse.Namespace) -> int:
    from tuner.run import print_summary, run
    from tuner.store import StoreLocked

    cfg = cli.run_config(args)
    try:
        summary = run(cfg)
    except StoreLocked as exc:
        how = ("waited the time given with --wait" if args.wait is not None else
               "run with --wait to queue behind it (--wait SECONDS: at most that long)")
        print(f"tuner run: {exc.holder_text()}; {how}", file=sys.stderr)
        return 3
    if args.json:
        json.dump(summary, sys.stdout, indent=1, default=str)
        print()
    else:
        print_summary(summary)
    status = 0 if summary.get("winner") else 1
    check = summary.get("isa_check") or {}
    if check.get("ok") is False:
        print(f"tuner run: ISA CHECK FAILED: the emitted library {check['library']} does not use "
              f"the vector registers its build promises: {check['message']}", file=sys.stderr)
        status = 1
    rep = summary.get("report") or {}
    if rep.get("errors"):
        where = (summary.get("emitted") or {}).get("dir") or summary.get("store")
        print(f"tuner run: the report is incomplete ({'; '.join(rep['errors'])}); the results "
              f"are kept in {where}", file=sys.stderr)
        status = 1
    return status


def _cmd_report(args: argparse.Namespace) -> int:
    from tuner.report import write_report

    tuned = Path(args.tuned_dir) if args.tuned_dir else None
    if tuned is None or args.store is None or args.out is None:
        hid = tuned.name if tuned is not None else hostid.host_id()
        tuned = tuned or build_dir_default() / "tuned" / hid
        manifest = {}
        try:
            manifest = json.loads((tuned / "manifest.json").read_text())
        except (OSError, ValueError):
            pass  # the report itself says what is missing
        hid = (manifest.get("host") or {}).get("host_id") or hid
        store = args.store or (manifest.get("summary") or {}).get("store")
        if not store or not Path(store).exists():
            store = args.store or build_dir_default() / "tuner" / f"results-{hid}.sqlite"
        out = args.out or reports_dir_default() / hid
    else:
        store, out = args.store, args.out
    try:
        res = write_report(store, tuned, out, bench_json=args.bench_json)
    except OSError as exc:
        print(f"tuner report: cannot write the report in {out}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(res, sys.stdout, indent=1, default=str)
        print()
    else:
        print(f"written: {res['html']}\n         {res['md']}")
        for what, why in res["missing"]:
            print(f"  missing {what}: {why}")
        check = res["isa_check"]
        if check:
            verdict = {True: "ok", False: "FAILED", None: "not checked"}[check["ok"]]
            print(f"  ISA check {verdict}: {check['message']}")
    for e in res["errors"]:
        print(f"tuner report: plot failed: {e}", file=sys.stderr)
    return 1 if res["errors"] else 0


def build_parser() -> argparse.ArgumentParser:
    parser = _cli.Parser(prog="python -m tuner", description=__doc__.split("\n")[0],
                                     epilog="Exit status: 0 ok; 1 failed; 2 usage; 3 store locked; "
                                     "4 artifact for another host/toolchain (check).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    host_commands.add_commands(sub)

    p = sub.add_parser("run", help="tune the expert kernels for this host and emit the result",
                       description="Probe the host, search the kernel knob space (build with "
                       "SCons, verify against NumPy, time inside C in a worker process), record "
                       "every measurement in the results store, re-time the finalists "
                       "interleaved with the default and emit build/tuned/<host-id>/ "
                       "(config.h, libcolibri.so, manifest.json), check that the library's "
                       "kernels use the vector registers its profile promises, and write the "
                       "report (reports/<host-id>/).",
                       epilog="Exit status: 0 ok; 1 no winner, the ISA check failed or the "
                       "report is incomplete (results kept); 2 usage; 3 store locked.")
    cli.add_run_options(p)
    p.add_argument("--no-emit", action="store_true", help="search only; emit nothing")
    p.add_argument("--no-report", action="store_true",
                   help="do not write reports/<host-id>/report.html and report.md at the end")
    p.add_argument("--report-dir", metavar="DIR", help="where the report goes "
                   "(default: reports/<host-id>)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--wait", nargs="?", type=_cli.non_negative_float, const=True, metavar="SECONDS",
                   help="when another run holds the results store, wait for it (at most "
                   "SECONDS when given) instead of exiting with status 3")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("report", help="write the tuning report (HTML page and Markdown) of a "
                       "results store and a tuned directory",
                       description="Write <out>/report.html (one self-contained page: plots "
                       "embedded as PNG data URIs, no network, no script) and <out>/report.md "
                       "(Markdown, with the plots as PNG files beside it) from the results "
                       "store, the tuned directory (manifest.json, build_info.json, config.h, "
                       "libcolibri.so: its kernels are disassembled to check their vector "
                       "registers) and bench.json when present. Reads files only; missing "
                       "inputs are named on the page.",
                       epilog="Exit status: 0 written; 1 a plot could not be drawn (the page "
                       "says which) or the output directory is not writable; 2 usage.")
    p.add_argument("--store", metavar="PATH",
                   help="results store (default: the one the manifest names, else "
                   "build/tuner/results-<host-id>.sqlite)")
    p.add_argument("--tuned-dir", metavar="DIR",
                   help="tuned directory (default: build/tuned/<this host's id>)")
    p.add_argument("--out", metavar="DIR", help="output directory (default: reports/<host-id>)")
    p.add_argument("--bench-json", metavar="PATH",
                   help="colibri_bench bench's JSON (default: <out>/bench.json when present)")
    p.add_argument("--json", action="store_true",
                   help="print what was written (paths, ISA check, missing inputs) as JSON")
    p.set_defaults(func=_cmd_report)

    ci.add_command(sub)
    check.add_command(sub)
    promote.add_command(sub)
    verify.add_command(sub)
    registry.add_command(sub)
    storage.add_command(sub)

    # replay has its own parser (tuner/search/replay.py); listed here for --help
    sub.add_parser("replay", help="run search strategies against a recorded results store "
                   "(python -m tuner replay --help)")

    for moved in ("bench", "soak"):  # these measure the engine, not tune it: colibri_bench
        sub.add_parser(moved, help=f"moved: python -m colibri_bench {moved}", add_help=False)

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["replay"]:
        from tuner.search import replay

        return replay.main(argv[1:])
    if argv[:1] in (["bench"], ["soak"]):
        print(f"python -m tuner {argv[0]}: moved to `python -m colibri_bench {argv[0]}` "
              "(same options)", file=sys.stderr)
        return _cli.EXIT_USAGE
    return _cli.run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
