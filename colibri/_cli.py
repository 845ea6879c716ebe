"""What every command line of the project shares (`python -m colibri`, `python -m tuner`):
argument types that refuse bad values with a message naming what is valid, a parser whose
usage errors are one line and exit status 2, and one way to run a command so that a
UsageError raised while it checks its input ends the same way."""
from __future__ import annotations

import argparse
import math
import sys

EXIT_USAGE = 2


class UsageError(Exception):
    """A bad argument found after parsing (an unknown profile, a malformed spec): the
    command prints the message on one line and exits 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error printed as one line ('PROG: error: ... (PROG --help
    lists the options)') instead of the usage block; exit status 2 as before."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


def _int_at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        v = low - 1
    if v < low:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def count(text: str) -> int:
    """A whole number >= 0."""
    return _int_at_least(text, 0)


def _finite(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def positive_float(text: str) -> float:
    v = _finite(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return v


def non_negative_float(text: str) -> float:
    v = _finite(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    v = _finite(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return v


def handoff(text: str):
    """colibri.hf.patch's handoff: 'auto', 'off' (None) or a token count >= 1."""
    if text == "auto":
        return text
    if text == "off":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected auto, off or a token count >= 1, got {text!r}")
    return n


def run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse argv and run the chosen command's `func(args)`; a UsageError it raises is
    printed as '<prog> <command>: <message>' and gives exit status 2."""
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        command = getattr(args, "command", None)
        print(f"{parser.prog}{' ' + command if command else ''}: {exc}", file=sys.stderr)
        return EXIT_USAGE
