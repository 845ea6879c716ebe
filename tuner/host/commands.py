"""`python -m tuner probe` and `python -m tuner profiles`.

    python -m tuner probe [--json] [--no-bandwidth | --quick] [--no-compute] [--threads 1,2,4]
                          [--seconds S] [--root DIR] [-o FILE]
    python -m tuner profiles [--json] [--cc gcc|clang|PATH] [NAME ...]

tuner/__main__.py registers both with add_commands(subparsers); each sets
`func(args) -> int` (the exit status). Standalone for testing:
    python -m tuner.host.commands probe --json --no-bandwidth
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from colibri import _cli

PROBE_HELP = ("describe this host: CPU, caches, NUMA, huge pages, compilers, memory bandwidth, "
              "compute peaks")
PROFILES_HELP = "list the target profiles, their flags here, and which one matches this host"


def _thread_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected thread counts like 1,2,4; got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("thread counts must be >= 1")
    return values


def cmd_probe(args: argparse.Namespace) -> int:
    from tuner.host import probe

    seconds = args.seconds if args.seconds is not None else (0.1 if args.quick else 0.3)
    threads = args.threads
    if args.quick and threads is None:
        import os
        n = os.cpu_count() or 1
        threads = (1, n) if n > 1 else (1,)
    try:
        info = probe.probe(root=args.root, measure_bandwidth=not args.no_bandwidth,
                           bandwidth_threads=threads, bandwidth_seconds=seconds,
                           measure_compute=not args.no_compute)
    except (OSError, ValueError) as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return 2
    text = (json.dumps(info.to_dict(), indent=2) + "\n") if args.json else probe.format_text(info) + "\n"
    if args.output:
        Path(args.output).write_text(json.dumps(info.to_dict(), indent=2) + "\n")
    sys.stdout.write(text)
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from colibri_build import profiles

    try:
        rep = profiles.report(args.names or None, args.cc)
    except profiles.ProfileError as exc:
        print(f"profiles: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rep, indent=2) if args.json else profiles.format_report(rep))
    return 0


def add_commands(sub) -> None:
    """Register `probe` and `profiles` on an argparse subparsers object."""
    p = sub.add_parser("probe", help=PROBE_HELP, description=PROBE_HELP + ". Measuring the "
                       "bandwidth and the compute peaks builds this host's default library if "
                       "it is missing and takes a few seconds; --no-bandwidth and --no-compute "
                       "skip them.")
    p.add_argument("--json", action="store_true", help="print the HostInfo as JSON")
    bw = p.add_mutually_exclusive_group()
    bw.add_argument("--no-bandwidth", action="store_true",
                    help="do not measure memory bandwidth (bandwidth: null)")
    bw.add_argument("--quick", action="store_true",
                    help="shorter run: 1 and all threads, 0.1 s per figure")
    p.add_argument("--no-compute", action="store_true",
                   help="do not measure the compute peaks (compute: null)")
    p.add_argument("--threads", type=_thread_list, default=None, metavar="N,N,...",
                   help="thread counts to measure (default 1, 2, 4, ... up to the CPU count)")
    p.add_argument("--seconds", type=_cli.positive_float, default=None, metavar="S",
                   help="minimum timed seconds per figure (default 0.3; --quick 0.1)")
    p.add_argument("--root", default="/", metavar="DIR",
                   help="probe a recorded tree (proc/cpuinfo + sys/) instead of this machine, "
                        "e.g. tests/fixtures/hosts/genoa-2s")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the JSON to FILE")
    p.set_defaults(func=cmd_probe)

    q = sub.add_parser("profiles", help=PROFILES_HELP, description=PROFILES_HELP + ": "
                       "inheritance, resolved compiler flags and fallback notes, whether "
                       "this host can run each, and why it was (not) selected.")
    q.add_argument("names", nargs="*", help="only these profiles (default: all)")
    q.add_argument("--cc", default="gcc",
                   help="compiler family (gcc, clang) or executable to resolve flags for")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.set_defaults(func=cmd_profiles)


def main(argv: list[str] | None = None) -> int:
    ap = _cli.Parser(prog="python -m tuner.host.commands", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    add_commands(sub)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
