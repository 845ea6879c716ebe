"""python -m colibri: command-line tools of the Colibri binding.

    python -m colibri dump-schema FILE
    python -m colibri demo [--threads N] [--dtype f32|bf16|int8 ...]

dump-schema runs the C tool colibri_dump_schema that the build puts beside
libcolibri.so (the library colibri._lib would load: $COLIBRI_LIB, the tuned
library for this host, or the default build of this host's profile).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

TOOL = "colibri_dump_schema"
EXIT_NO_TOOL = 3


def dump_schema_tool() -> Path:
    """Path of colibri_dump_schema beside the library this host uses (may not exist)."""
    from . import _lib

    return Path(_lib.default_library_path()).resolve().parent / TOOL


def _cmd_dump_schema(args: argparse.Namespace) -> int:
    from ._lib import ColibriError

    try:
        tool = dump_schema_tool()
    except (ColibriError, ImportError, OSError) as e:
        print(f"colibri dump-schema: cannot find the library to run beside: {e}", file=sys.stderr)
        return EXIT_NO_TOOL
    if not os.access(tool, os.X_OK):
        print(f"colibri dump-schema: {TOOL} is not built: expected it at {tool} (beside the "
              f"library). Build it with `scons profile=<profile>` (it builds {TOOL} next to "
              f"libcolibri.so), or point COLIBRI_LIB at a library that has it beside it.",
              file=sys.stderr)
        return EXIT_NO_TOOL
    sys.stdout.flush()
    return subprocess.run([str(tool), os.fspath(args.file)]).returncode


def _cmd_demo(args: argparse.Namespace) -> int:
    from . import demo

    return demo.main(dtypes=tuple(args.dtype or ("f32", "bf16", "int8")), threads=args.threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m colibri",
        description="Colibri MoE inference engine: command-line tools.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser(
        "dump-schema",
        help="print a model file's header, slot table and tensor table, and check it",
        description="Print the header, slot table summary and tensor table of a Colibri model "
                    "file (FORMAT.md) and check every tensor's CRC-32.",
        epilog=f"Exit status: 0 valid file; 1 broken file (what is wrong and its byte offset on "
               f"stderr); 2 usage error; {EXIT_NO_TOOL} the {TOOL} tool is not built.")
    p.add_argument("file", help="the model file")
    p.set_defaults(func=_cmd_dump_schema)
    p = sub.add_parser(
        "demo",
        help="build the engine for this host and run a Qwen3-30B-A3B-shaped layer",
        description="Build (if needed) the library for this host, run a Qwen3-30B-A3B-shaped MoE "
                    "layer with random weights in each dtype, check it against the float64 NumPy "
                    "reference and print per-call timings (needs about 5 GB of memory).",
        epilog="Exit status: 0 all checks passed; 1 a check failed.")
    p.add_argument("--threads", type=int, default=None, help="threads (default: one per CPU)")
    p.add_argument("--dtype", action="append", choices=["f32", "bf16", "int8"],
                   help="weight dtype to run (repeatable; default: all three)")
    p.set_defaults(func=_cmd_demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
