"""python -m tuner: probe the host, tune the kernels, emit config.h + libcolibri.so.

Commands: probe, profiles, run, replay, bench, report, soak, ci, check, merge.
`python -m tuner COMMAND --help` for each. Exit status: 0 success; 1 the command
failed (message on stderr); 2 usage error; 3 the results store is locked by another
run; 4 (check) the artifact was made for another host or toolchain.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def run_config(args: argparse.Namespace, command: str = "run"):
    """The RunConfig of parsed run options (add_run_options); an int exit status on bad input."""
    from .run import RunConfig

    probs = tuple(args.problem) if args.problem else None  # None: every class's domain
    cfg = RunConfig(profile=args.profile, problems=probs, strategy=args.strategy,
                    max_evals=args.max_evals, budget_s=args.budget, quick=args.quick,
                    threads=args.threads, min_seconds=args.min_seconds, seed=args.seed,
                    emit=not getattr(args, "no_emit", False),
                    measure_bandwidth=not args.no_bandwidth,
                    wait=False if getattr(args, "wait", None) is None else args.wait,
                    report=not getattr(args, "no_report", False),
                    report_dir=Path(args.report_dir) if getattr(args, "report_dir", None) else None)
    if args.quick:  # the same domains, fewer values, timed for less
        cfg.min_seconds, cfg.warmup = min(cfg.min_seconds, 0.05), 1
        cfg.finalists, cfg.retime_rounds = 2, 4
        cfg.gate_rounds, cfg.gate_min_seconds = 4, 0.05
    if getattr(args, "no_gate", False):
        cfg.gate = False
    if getattr(args, "gate_shape", None):
        cfg.gate_shapes = tuple(args.gate_shape)
    if args.space:
        restrict = {}
        for item in args.space:
            name, _, values = item.partition("=")
            if not values:
                print(f"tuner {command}: --space wants KNOB=V1,V2,..., got {item!r}", file=sys.stderr)
                return 2
            restrict[name] = [int(v) if v.lstrip("-").isdigit() else v for v in values.split(",")]
        cfg.space_overrides = restrict
    if args.store:
        cfg.store_path = Path(args.store)
    if args.build_dir:
        cfg.build_dir = Path(args.build_dir)
    if args.from_registry:
        reg = Path(args.from_registry)
        if not reg.is_file():
            print(f"tuner {command}: registry {reg} does not exist", file=sys.stderr)
            return 2
        from .store import Store, StoreError

        try:  # a foreign file or another schema version: say so now, not mid-run
            Store(reg, readonly=True).close()
        except StoreError as exc:
            print(f"tuner {command}: --from-registry: {exc}", file=sys.stderr)
            return 2
        if args.registry_top < 1:
            print(f"tuner {command}: --registry-top wants a count >= 1", file=sys.stderr)
            return 2
        cfg.registry = reg
        cfg.registry_top = args.registry_top
    return cfg


def _cmd_run(args: argparse.Namespace) -> int:
    from .run import print_summary, run
    from .store import StoreLocked

    cfg = run_config(args)
    if isinstance(cfg, int):
        return cfg
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
    from colibri._lib import build_dir_default

    from . import hostmatch
    from .report import write_report

    tuned = Path(args.tuned_dir) if args.tuned_dir else None
    if tuned is None or args.store is None or args.out is None:
        hid = tuned.name if tuned is not None else hostmatch.host_id()
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
        out = args.out or Path(__file__).resolve().parent.parent / "reports" / hid
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


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be finite and >= 0, got {text!r}")
    return v


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner", description=__doc__.split("\n")[0],
                                     epilog="Exit status: 0 ok; 1 failed; 2 usage; 3 store locked; "
                                     "4 artifact for another host/toolchain (check).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    try:
        from .cli_probe import add_commands
        add_commands(sub)
    except ImportError:  # pragma: no cover
        pass

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
    add_run_options(p)
    p.add_argument("--no-emit", action="store_true", help="search only; emit nothing")
    p.add_argument("--no-report", action="store_true",
                   help="do not write reports/<host-id>/report.html and report.md at the end")
    p.add_argument("--report-dir", metavar="DIR", help="where the report goes "
                   "(default: reports/<host-id>)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--wait", nargs="?", type=_seconds, const=True, metavar="SECONDS",
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
                   help="tuner bench's JSON (default: <out>/bench.json when present)")
    p.add_argument("--json", action="store_true",
                   help="print what was written (paths, ISA check, missing inputs) as JSON")
    p.set_defaults(func=_cmd_report)

    from . import check, ci, registry

    ci.add_command(sub)
    check.add_command(sub)
    registry.add_command(sub)

    # replay has its own parser (tuner/replay.py); listed here for --help
    sub.add_parser("replay", help="run search strategies against a recorded results store "
                   "(python -m tuner replay --help)")

    sub.add_parser("bench", help="the MoE layer side by side with NumPy and PyTorch, with the "
                   "read bandwidth (python -m tuner bench --help)")

    sub.add_parser("soak", help="run a layer over N tokens, creating and freeing layers, and "
                   "report resident memory over time (python -m tuner soak --help)")

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["replay"]:
        from . import replay

        return replay.main(argv[1:])
    if argv[:1] == ["soak"]:
        from . import soak

        return soak.main(argv[1:])
    if argv[:1] == ["bench"]:
        from . import bench

        return bench.main(argv[1:])
    args = parser.parse_args(argv)
    return args.func(args)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a tuning run, shared by `run` and `ci`."""
    p.add_argument("--quick", action="store_true",
                   help="each knob's quick values only, shorter timings and a shorter gate; the same "
                   "domains as a full run (minutes on a 2-core machine)")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="stop searching after this much wall time")
    p.add_argument("--max-evals", type=int, help="stop after this many variants")
    p.add_argument("--strategy", choices=["exhaustive", "random", "annealing", "tpe"],
                   help="search strategy (default: exhaustive when the space fits the budget)")
    p.add_argument("--problem", action="append", metavar="SHAPE/PHASE/DTYPE",
                   help="problem to tune for (repeatable), e.g. qwen3-30b-a3b/decode/bf16 "
                   "(default: the qwen3-30b-a3b problems covering every knob's domain)")
    p.add_argument("--no-gate", action="store_true",
                   help="emit without checking the candidate against the default build "
                   "(the gate: every dtype x decode/prefill128/prefill512 x 2 shapes x threads)")
    p.add_argument("--gate-shape", action="append", metavar="SHAPE",
                   help="shapes the gate validates on (repeatable; default: the tuned shape "
                   "and olmoe-1b-7b)")
    p.add_argument("--profile", help="target profile (default: this host's)")
    p.add_argument("--space", action="append", metavar="KNOB=V1,V2",
                   help="restrict a knob to these values (repeatable)")
    p.add_argument("--threads", type=int, help="threads per layer call (default: all CPUs)")
    p.add_argument("--min-seconds", type=float, default=0.5,
                   help="timing per variant and problem (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, inputs and search")
    p.add_argument("--store", help="results store (default: build/tuner/results-<host-id>.sqlite)")
    p.add_argument("--build-dir", help="build root (default: build/)")
    p.add_argument("--no-bandwidth", action="store_true",
                   help="skip the bandwidth probe (no %% of bandwidth in the summary)")
    p.add_argument("--from-registry", metavar="REGISTRY",
                   help="a merged results store (tuner merge): start each search from the best "
                   "variants that hosts of the same profile, microarchitecture and compiler "
                   "(major version) found, measure those here, and stop")
    p.add_argument("--registry-top", type=int, default=3, metavar="N",
                   help="registry variants taken per kernel class (default 3)")


if __name__ == "__main__":
    sys.exit(main())
