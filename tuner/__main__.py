"""python -m tuner: probe the host, tune the kernels, emit config.h + libcolibri.so.

Commands: probe, profiles, run, replay, bench, soak. `python -m tuner COMMAND --help` for each.
Exit status: 0 success; 1 the command failed (message on stderr); 2 usage error;
3 the results store is locked by another run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _cmd_run(args: argparse.Namespace) -> int:
    from . import problems
    from .run import RunConfig, print_summary, run
    from .store import StoreLocked

    probs = tuple(args.problem) if args.problem else (
        problems.QUICK_PROBLEMS if args.quick else problems.DEFAULT_PROBLEMS)
    cfg = RunConfig(profile=args.profile, problems=probs, strategy=args.strategy,
                    max_evals=args.max_evals, budget_s=args.budget, quick=args.quick,
                    threads=args.threads, min_seconds=args.min_seconds, seed=args.seed,
                    emit=not args.no_emit, measure_bandwidth=not args.no_bandwidth,
                    wait=False if args.wait is None else args.wait)
    if args.quick:
        cfg.min_seconds = min(cfg.min_seconds, 0.3)
        cfg.retime_rounds = 3
    if args.space:
        restrict = {}
        for item in args.space:
            name, _, values = item.partition("=")
            if not values:
                print(f"tuner run: --space wants KNOB=V1,V2,..., got {item!r}", file=sys.stderr)
                return 2
            restrict[name] = [int(v) if v.lstrip("-").isdigit() else v for v in values.split(",")]
        cfg.space_overrides = restrict
    if args.store:
        cfg.store_path = Path(args.store)
    if args.build_dir:
        cfg.build_dir = Path(args.build_dir)
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
    return 0 if summary.get("winner") else 1


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
                                     epilog="Exit status: 0 ok; 1 failed; 2 usage; 3 store locked.")
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
                       "(config.h, libcolibri.so, manifest.json).")
    p.add_argument("--quick", action="store_true",
                   help="a small space and short timings (minutes on a 2-core machine)")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="stop searching after this much wall time")
    p.add_argument("--max-evals", type=int, help="stop after this many variants")
    p.add_argument("--strategy", choices=["exhaustive", "random", "annealing", "tpe"],
                   help="search strategy (default: exhaustive when the space fits the budget)")
    p.add_argument("--problem", action="append", metavar="SHAPE/PHASE/DTYPE",
                   help="problem to tune for (repeatable), e.g. qwen3-30b-a3b/decode/bf16")
    p.add_argument("--profile", help="target profile (default: this host's)")
    p.add_argument("--space", action="append", metavar="KNOB=V1,V2",
                   help="restrict a knob to these values (repeatable)")
    p.add_argument("--threads", type=int, help="threads per layer call (default: all CPUs)")
    p.add_argument("--min-seconds", type=float, default=0.5,
                   help="timing per variant and problem (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, inputs and search")
    p.add_argument("--store", help="results store (default: build/tuner/results-<host-id>.sqlite)")
    p.add_argument("--build-dir", help="build root (default: build/)")
    p.add_argument("--no-emit", action="store_true", help="search only; emit nothing")
    p.add_argument("--no-bandwidth", action="store_true",
                   help="skip the bandwidth probe (no %% of bandwidth in the summary)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--wait", nargs="?", type=_seconds, const=True, metavar="SECONDS",
                   help="when another run holds the results store, wait for it (at most "
                   "SECONDS when given) instead of exiting with status 3")
    p.set_defaults(func=_cmd_run)

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


if __name__ == "__main__":
    sys.exit(main())
