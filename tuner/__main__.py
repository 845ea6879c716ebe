"""python -m tuner: probe the host, tune the kernels, emit config.h + libcolibri.so.

Commands: probe, profiles, run, replay, bench, ci, check, merge. `python -m tuner COMMAND
--help` for each. Exit status: 0 success; 1 the command failed (message on stderr); 2 usage
error; 3 the results store is locked by another run; 4 (check) the artifact was built for
another host or toolchain.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def run_config(args: argparse.Namespace, command: str = "run"):
    """The RunConfig of parsed run options (add_run_options); an int exit status on bad input."""
    from . import problems
    from .run import RunConfig

    probs = tuple(args.problem) if args.problem else (
        problems.QUICK_PROBLEMS if args.quick else problems.DEFAULT_PROBLEMS)
    cfg = RunConfig(profile=args.profile, problems=probs, strategy=args.strategy,
                    max_evals=args.max_evals, budget_s=args.budget, quick=args.quick,
                    threads=args.threads, min_seconds=args.min_seconds, seed=args.seed,
                    emit=not getattr(args, "no_emit", False),
                    measure_bandwidth=not args.no_bandwidth)
    if args.quick:
        cfg.min_seconds = min(cfg.min_seconds, 0.3)
        cfg.retime_rounds = 3
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
        print(f"tuner run: {exc}", file=sys.stderr)
        return 3
    if args.json:
        json.dump(summary, sys.stdout, indent=1, default=str)
        print()
    else:
        print_summary(summary)
    return 0 if summary.get("winner") else 1


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
                       "(config.h, libcolibri.so, manifest.json).")
    add_run_options(p)
    p.add_argument("--no-emit", action="store_true", help="search only; emit nothing")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_run)

    from . import check, ci, registry

    ci.add_command(sub)
    check.add_command(sub)
    registry.add_command(sub)

    # replay has its own parser (tuner/replay.py); listed here for --help
    sub.add_parser("replay", help="run search strategies against a recorded results store "
                   "(python -m tuner replay --help)")

    sub.add_parser("bench", help="the MoE layer side by side with NumPy and PyTorch, with the "
                   "read bandwidth (python -m tuner bench --help)")

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["replay"]:
        from . import replay

        return replay.main(argv[1:])
    if argv[:1] == ["bench"]:
        from . import bench

        return bench.main(argv[1:])
    args = parser.parse_args(argv)
    return args.func(args)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a tuning run, shared by `run` and `ci`."""
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
