"""What the tuner's commands share: the options of a tuning run (`run` and `ci`), their
checking into a RunConfig, argument types, and the plain progress printer for logs."""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from colibri._cli import UsageError, count, positive_float, positive_int


def plain_log(stream=None):
    """A progress printer for logs: one line per message, a carriage return (a redrawn
    progress line) becomes a line break when the stream is not a terminal."""
    stream = stream or sys.stderr
    tty = stream.isatty()

    def say(msg: str) -> None:
        text = str(msg)
        if not tty:
            text = "\n".join(part for part in text.replace("\r\n", "\n").replace("\r", "\n")
                             .split("\n") if part.strip())
        print(text, file=stream, flush=True)
    return say


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a tuning run, shared by `run` and `ci`."""
    p.add_argument("--quick", action="store_true",
                   help="each knob's quick values only, shorter timings and a shorter gate; the same "
                   "domains as a full run (minutes on a 2-core machine)")
    p.add_argument("--budget", type=positive_float, metavar="SECONDS",
                   help="stop searching after this much wall time")
    p.add_argument("--max-evals", type=positive_int, help="stop after this many variants")
    p.add_argument("--strategy", choices=["exhaustive", "random", "annealing", "tpe"],
                   help="search strategy (default: exhaustive when the space fits the budget)")
    p.add_argument("--shape", action="append", metavar="NAME",
                   help="a reference shape to tune for (repeatable): "
                   "qwen3-30b-a3b (the default), mixtral-8x7b, olmoe-1b-7b, qwen1.5-moe-a2.7b, "
                   "deepseek-v2-lite; each is tuned as its own shape class, and layers of other "
                   "shapes run the profile's defaults")
    p.add_argument("--shape-of", action="append", metavar="PATH",
                   help="tune for the shape of a model (repeatable): a transformers checkpoint "
                   "folder (its config.json) or a .colibri model file")
    p.add_argument("--problem", action="append", metavar="SHAPE/PHASE/DTYPE",
                   help="problem to tune for (repeatable), e.g. qwen3-30b-a3b/decode/bf16 "
                   "(default: each tuned shape's problems covering every knob's domain)")
    p.add_argument("--no-gate", action="store_true",
                   help="emit without checking the candidate against the default build "
                   "(the gate: every dtype x decode/prefill128/prefill512 x 2 shapes x threads)")
    p.add_argument("--gate-shape", action="append", metavar="SHAPE",
                   help="more shapes the gate checks (repeatable): timed when a tuned shape "
                   "class holds them, else checked to run the default's code")
    p.add_argument("--profile", help="target profile (default: this host's)")
    p.add_argument("--space", action="append", metavar="KNOB=V1,V2",
                   help="restrict a knob to these values (repeatable)")
    p.add_argument("--threads", type=positive_int, help="threads per layer call (default: all CPUs)")
    p.add_argument("--min-seconds", type=positive_float, default=0.5,
                   help="timing per variant and problem (default 0.5)")
    p.add_argument("--seed", type=count, default=0, help="seed of weights, inputs and search")
    p.add_argument("--store", help="results store (default: build/tuner/results-<host-id>.sqlite)")
    p.add_argument("--build-dir", help="build root (default: build/)")
    p.add_argument("--no-bandwidth", action="store_true",
                   help="skip the bandwidth probe (no %% of bandwidth in the summary)")
    p.add_argument("--from-registry", metavar="REGISTRY",
                   help="a merged results store (tuner merge): start each search from the best "
                   "variants that hosts of the same profile, microarchitecture and compiler "
                   "(major version) found, measure those here, and stop")
    p.add_argument("--registry-top", type=positive_int, default=3, metavar="N",
                   help="registry variants taken per kernel class (default 3)")


def run_config(args: argparse.Namespace):
    """The RunConfig of parsed run options (add_run_options); UsageError names a bad one."""
    from colibri_build import profiles

    from tuner.measure import problems as problems_mod
    from tuner.run import RunConfig

    if args.profile is not None:
        known = sorted(profiles.registry())
        if args.profile not in known:
            raise UsageError(f"unknown profile {args.profile!r} (known: {', '.join(known)})")
    for name in args.problem or ():
        try:
            problems_mod.problem(name)
        except (KeyError, ValueError) as exc:
            raise UsageError(f"--problem: {exc}") from None
    if args.strategy == "tpe" and importlib.util.find_spec("optuna") is None:
        raise UsageError("--strategy tpe needs optuna, which is not installed "
                         "(pip install 'colibri-moe[tune]')")
    for shape in getattr(args, "gate_shape", None) or ():
        if shape not in problems_mod.SHAPES:
            raise UsageError(f"--gate-shape {shape!r}: unknown shape (known: "
                             f"{', '.join(sorted(problems_mod.SHAPES))})")
    probs = tuple(args.problem) if args.problem else None  # None: every class's domain
    tuned = list(args.shape or ())
    for name in tuned:
        if name not in problems_mod.SHAPES:
            raise UsageError(f"--shape {name!r}: unknown shape (known: "
                             f"{', '.join(sorted(problems_mod.SHAPES))})")
    for path in getattr(args, "shape_of", None) or ():
        from tuner.measure import model_shape

        try:
            tuned.append(model_shape.register(path))
        except model_shape.ShapeError as exc:
            raise UsageError(f"--shape-of {path}: {exc}") from None
    if probs and tuned:
        raise UsageError("--problem names its shapes; it does not go with --shape or --shape-of")
    cfg = RunConfig(profile=args.profile, problems=probs, strategy=args.strategy,
                    shapes=tuple(dict.fromkeys(tuned)) or None,
                    max_evals=args.max_evals, budget_s=args.budget, quick=args.quick,
                    threads=args.threads, min_seconds=args.min_seconds, seed=args.seed,
                    emit=not getattr(args, "no_emit", False),
                    measure_bandwidth=not args.no_bandwidth,
                    wait=False if getattr(args, "wait", None) is None else args.wait,
                    report=not getattr(args, "no_report", False),
                    report_dir=Path(args.report_dir) if getattr(args, "report_dir", None) else None)
    if args.quick:  # the same domains, fewer values, timed for less
        cfg.min_seconds, cfg.warmup = min(cfg.min_seconds, 0.05), 1
        cfg.finalists, cfg.race_rounds, cfg.race_min_seconds, cfg.race_budget_s = 2, (3, 6), 0.05, 20.0
        cfg.gate_rounds, cfg.gate_min_seconds = 6, 0.05
    if getattr(args, "no_gate", False):
        cfg.gate = False
    if getattr(args, "gate_shape", None):
        cfg.gate_shapes = tuple(args.gate_shape)
    if args.space:
        restrict = {}
        for item in args.space:
            name, _, values = item.partition("=")
            if not values:
                raise UsageError(f"--space wants KNOB=V1,V2,..., got {item!r}")
            restrict[name] = [int(v) if v.lstrip("-").isdigit() else v for v in values.split(",")]
        cfg.space_overrides = restrict
    if args.store:
        cfg.store_path = Path(args.store)
    if args.build_dir:
        cfg.build_dir = Path(args.build_dir)
    if args.from_registry:
        reg = Path(args.from_registry)
        if not reg.is_file():
            raise UsageError(f"registry {reg} does not exist")
        from tuner.store import Store, StoreError

        try:  # a foreign file or another schema version: say so now, not mid-run
            Store(reg, readonly=True).close()
        except StoreError as exc:
            raise UsageError(f"--from-registry: {exc}") from None
        cfg.registry = reg
        cfg.registry_top = args.registry_top
    return cfg
