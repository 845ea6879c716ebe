"""python -m colibri: command-line tools of the Colibri binding.

    python -m colibri dump-schema FILE [--json]
    python -m colibri demo [--threads N] [--dtype DTYPE ...] [--json]
    python -m colibri convert SRC... --out MODEL.colibri [--arch ARCH] [--weight-dtype DTYPE]
                              [--config config.json] [--layers N-M] [--json] [--quiet]
    python -m colibri generate --model DIR --prompt TEXT [--weight-dtype DTYPE]
                               [--max-new-tokens N] [--threads T] [--no-patch] [--json]

`python -m colibri COMMAND --help` documents each. Conventions shared with
`python -m tuner`: data goes to stdout (as JSON with --json), progress and errors to
stderr; exit status 0 success, 1 failure, 2 usage error, 3 a missing tool.

dump-schema runs the C tool colibri_dump_schema that the build puts beside
libcolibri.so (the library colibri._lib would load: $COLIBRI_LIB, the tuned
library for this host, or the default build of this host's profile).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from . import _cli, quant

TOOL = "colibri_dump_schema"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_TOOL = 0, 1, 2, 3


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
    if not args.json:
        return subprocess.run([str(tool), os.fspath(args.file)]).returncode
    # --json: the C tool gives the verdict (it is the loader's own check); the tables come
    # from the Python reader, which reads what the file says without judging it.
    from .modelfile import read_header

    proc = subprocess.run([str(tool), os.fspath(args.file)], capture_output=True, text=True)
    out: dict = {"file": os.fspath(args.file), "valid": proc.returncode == 0,
                 "error": (proc.stderr.strip() or None) if proc.returncode else None}
    try:
        out.update(read_header(args.file))
    except (OSError, ValueError) as e:
        out["error"] = out["error"] or str(e)
    json.dump(out, sys.stdout, indent=1)
    print()
    return proc.returncode if proc.returncode in (EXIT_OK, EXIT_FAILED, EXIT_USAGE) else EXIT_FAILED


def _cmd_demo(args: argparse.Namespace) -> int:
    from . import demo

    return demo.main(dtypes=tuple(args.dtype or demo.DEFAULT_DTYPES), threads=args.threads,
                     as_json=args.json)


def _cmd_convert(args: argparse.Namespace) -> int:
    from . import convert

    return convert.run(args)


def build_parser() -> argparse.ArgumentParser:
    from . import convert, generate

    parser = _cli.Parser(
        prog="python -m colibri",
        description="Colibri MoE inference engine: command-line tools. "
                    "`python -m colibri COMMAND --help` documents each.",
        epilog=f"Exit status: {EXIT_OK} success; {EXIT_FAILED} failure (message on stderr); "
               f"{EXIT_USAGE} usage error; {EXIT_NO_TOOL} a tool the command runs is not built.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser(
        "dump-schema",
        help="print a model file's header, slot table and tensor table, and check it",
        description="Print the header, slot table summary and tensor table of a Colibri model "
                    "file (FORMAT.md) and check every tensor's CRC-32.",
        epilog=f"Exit status: {EXIT_OK} valid file; {EXIT_FAILED} broken file (what is wrong and "
               f"its byte offset on stderr, or in \"error\" with --json); {EXIT_USAGE} usage "
               f"error; {EXIT_NO_TOOL} the {TOOL} tool is not built.")
    p.add_argument("file", help="the model file")
    p.add_argument("--json", action="store_true",
                   help="print the header, slots and tensor table as JSON, with the verdict "
                        "(\"valid\", \"error\")")
    p.set_defaults(func=_cmd_dump_schema)
    p = sub.add_parser(
        "demo",
        help="build the engine for this host and run a Qwen3-30B-A3B-shaped layer",
        description="Build (if needed) the library for this host, run a Qwen3-30B-A3B-shaped MoE "
                    "layer with random weights in each dtype, check it against the float64 NumPy "
                    "reference and print per-call timings (needs about 5 GB of memory).",
        epilog=f"Exit status: {EXIT_OK} all checks passed; {EXIT_FAILED} a check failed; "
               f"{EXIT_USAGE} usage error.")
    p.add_argument("--threads", type=_cli.positive_int, default=None, help="threads (default: one per CPU)")
    p.add_argument("--dtype", action="append", choices=list(quant.DTYPES),
                   help="weight dtype to run (repeatable; default: f32, bf16 and int8)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("convert", help="convert a Hugging Face safetensors checkpoint's MoE "
                                       "layers to a model file",
                       description=convert.DESCRIPTION, epilog=convert.EPILOG)
    convert.add_arguments(p)
    p.set_defaults(func=_cmd_convert)
    p = sub.add_parser("generate", help="generate text with a local transformers checkpoint whose "
                                        "MoE blocks run on Colibri",
                       description=generate.DESCRIPTION, epilog=generate.EPILOG)
    generate.add_arguments(p)
    p.set_defaults(func=generate.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    return _cli.run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
