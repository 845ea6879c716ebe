"""`python -m tuner ci --out DIR`: the tuning run a CI job makes on one machine of a fleet.

Runs `tuner run` (same options), writes the report, and packs one self-describing
artifact, DIR/colibri-<profile>-<host-id>.tar.gz, whose top directory (same name)
holds:

  config.h          the tuned knobs (generated, signed)
  libcolibri.so     built from it (build_info.json beside it: the ISA it needs)
  colibri.h         the C API (kernels/colibri.h)
  manifest.json     host, profile, compiler, flags, signature parts, winners, figures
  report.html       the report page (tuner.report), report.md its summary and
  report-*.png      the plots report.md links
  results.sqlite    a snapshot of the results store (the input of `tuner merge`)

Made for machines without a terminal: progress goes to stderr as plain lines, never
`\\r`-redrawn; stdout carries only the result (the tarball's path, or with --json one
JSON object). The tarball is written to a temporary name and renamed, so DIR never
holds half an artifact. Exit status: 0 the artifact is written; 1 any failure
(message on stderr); 2 usage; 3 the results store is locked by another run.

With --emulated (and --profile P of another architecture), nothing is tuned or timed:
tuner/fleet/emulated.py builds, verifies under qemu-user and packs the profile's defaults.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import tempfile
from pathlib import Path

from colibri_build.paths import HEADER
from tuner import cli
from tuner.fleet.tarball import pack

MEMBERS = ("config.h", "libcolibri.so", "build_info.json", "colibri.h", "manifest.json",
           "report.html", "report.md", "results.sqlite")


class CIError(RuntimeError):
    """A step of the CI job failed; the message says which and why."""


def add_command(sub) -> None:
    p = sub.add_parser("ci", help="tune, report and pack a per-machine artifact (for CI jobs)",
                       description="Run `tuner run` (same options), write the report and pack "
                       "DIR/colibri-<profile>-<host-id>.tar.gz: config.h, libcolibri.so, "
                       "build_info.json, colibri.h, manifest.json, report.html, report.md (with "
                       "its plots) and results.sqlite (a snapshot of the results store). Progress goes to stderr "
                       "as plain lines; stdout gets the tarball's path (or, with --json, one "
                       "JSON object).",
                       epilog="Exit status: 0 artifact written; 1 failed; 2 usage; 3 store locked.")
    p.add_argument("--out", required=True, metavar="DIR", help="where the tarball goes")
    cli.add_run_options(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (tarball, members, winner, figures)")
    p.add_argument("--emulated", action="store_true",
                   help="for a --profile of another architecture: no tuning and no timing; the "
                   "profile's default knobs, cross-built, verified under qemu-user and ISA-checked, "
                   "packed as DIR/colibri-<profile>-emulated.tar.gz whose manifest says "
                   "'emulated, not timed' (the run options other than --profile and --build-dir "
                   "do not apply)")
    p.set_defaults(func=main)


def report_writer():
    """tuner.report.write_report, or a CIError saying it is not there."""
    try:
        mod = importlib.import_module("tuner.report")
    except ImportError as exc:
        raise CIError(f"the report module tuner/report/__init__.py cannot be imported ({exc}); "
                      f"tuner ci packs the report and cannot run without it") from None
    fn = getattr(mod, "write_report", None)
    if not callable(fn):
        raise CIError("tuner/report/__init__.py has no write_report(store_path, tuned_dir, out_dir); "
                      "tuner ci packs the report and cannot run without it")
    return fn


def artifact_name(profile: str, host_id: str) -> str:
    return f"colibri-{profile}-{host_id}"


def build_artifact(summary: dict, out_dir: Path, write_report, say) -> dict:
    """Report + store snapshot + tarball from a finished run's summary."""
    from tuner.store import Store

    emitted = summary.get("emitted")
    if not emitted:
        raise CIError("the run emitted nothing (no winner, or --no-emit)")
    tuned = Path(emitted["dir"])
    name = artifact_name(summary["profile"], summary["host_id"])
    with tempfile.TemporaryDirectory(prefix=".stage-", dir=out_dir) as stage:
        stage = Path(stage)
        say("writing the report")
        try:
            rep = write_report(Path(summary["store"]), tuned, stage / "report")
        except Exception as exc:  # the report's own failure, named as such
            raise CIError(f"writing the report failed: {type(exc).__name__}: {exc}") from exc
        if rep.get("errors"):
            raise CIError(f"the report is incomplete: {'; '.join(map(str, rep['errors']))}")
        snap = stage / "results.sqlite"
        with Store(summary["store"], readonly=True) as st:
            st.snapshot(snap)
        files = {"config.h": tuned / "config.h", "libcolibri.so": tuned / "libcolibri.so",
                 "build_info.json": tuned / "build_info.json", "colibri.h": HEADER,
                 "manifest.json": tuned / "manifest.json",
                 "report.html": Path(rep.get("html", "")), "report.md": Path(rep.get("md", "")),
                 "results.sqlite": snap}
        # the plots report.md links, beside it as in the report directory
        for plot in (rep.get("plots") or {}).values():
            if plot:
                files[Path(plot).name] = Path(plot)
        missing = [m for m, p in files.items() if not p.is_file()]
        if missing:
            raise CIError(f"cannot pack {name}: missing {', '.join(missing)} "
                          f"({', '.join(str(files[m]) for m in missing)})")
        tarball = pack(out_dir, name, files)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    return {"tarball": str(tarball), "name": name, "members": [f"{name}/{m}" for m in files],
            "sha256": digest, "bytes": tarball.stat().st_size}


def main_emulated(args: argparse.Namespace) -> int:
    from colibri_build import profiles
    from tuner.fleet import emulated, verify

    if not args.profile:
        raise cli.UsageError("--emulated needs --profile (the machine to build for, e.g. neoverse-n1)")
    known = sorted(profiles.registry())
    if args.profile not in known:
        raise cli.UsageError(f"unknown profile {args.profile!r} (known: {', '.join(known)})")
    try:
        art = emulated.build_artifact(args.profile, Path(args.out), build_dir=args.build_dir,
                                      say=cli.plain_log())
    except (emulated.EmulatedError, verify.VerifyError, OSError, ValueError) as exc:
        print(f"tuner ci: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(art, sys.stdout, indent=1)
        print()
    else:
        print(art["tarball"])
    return 0


def main(args: argparse.Namespace) -> int:
    if getattr(args, "emulated", False):
        return main_emulated(args)
    from tuner.run import print_summary, run
    from tuner.store import StoreError, StoreLocked

    say = cli.plain_log()
    cfg = cli.run_config(args)
    cfg.emit = True
    cfg.report = False  # written below, into the artifact, not into reports/
    cfg.log = say
    out_dir = Path(args.out)
    try:
        write_report = report_writer()  # before tuning: fail in seconds, not after the run
        out_dir.mkdir(parents=True, exist_ok=True)
        summary = run(cfg)
        if not summary.get("winner"):
            raise CIError("no variant passed verification; nothing to pack")
        isa = summary.get("isa_check") or {}
        if isa.get("ok") is False:
            raise CIError(f"ISA CHECK FAILED: the emitted library {isa.get('library')} does not "
                          f"use the vector registers its build promises: {isa.get('message')}")
        if not args.json:
            print_summary(summary, out=sys.stderr)
        art = build_artifact(summary, out_dir, write_report, say)
    except StoreLocked as exc:
        print(f"tuner ci: {exc}", file=sys.stderr)
        return 3
    except (CIError, StoreError, OSError, ValueError, RuntimeError) as exc:
        print(f"tuner ci: {exc}", file=sys.stderr)
        return 1
    except SystemExit as exc:  # Tuner refuses a profile this host cannot run
        if isinstance(exc.code, str):
            print(f"tuner ci: {exc.code}", file=sys.stderr)
            return 1
        raise
    if args.json:
        w = summary["winner"]
        json.dump({**art, "host_id": summary["host_id"], "profile": summary["profile"],
                   "winner": w["vid"], "winner_is_default": w["is_default"],
                   "evaluations": summary["evaluations"],
                   "measured_this_run": summary["measured_this_run"],
                   "rows": summary["rows"], "wall_s": summary["wall_s"]},
                  sys.stdout, indent=1, default=str)
        print()
    else:
        print(art["tarball"])
    return 0
