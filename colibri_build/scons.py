"""The one way anything starts SCons: the binding's default build, the tuner's emit and
its variant batches all come through run()."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .paths import ROOT


def command(*args: str) -> list[str]:
    """The argv of `scons -Q ARGS` run with this interpreter (SConstruct imports this
    package, so it must see the same Python), on every CPU unless ARGS give -j: a library
    is a dozen kernel parts that compile independently, seconds each."""
    jobs = [] if any(a.startswith("-j") for a in args) else [f"-j{os.cpu_count() or 1}"]
    return [sys.executable, "-m", "SCons", "-Q", *jobs, *args]


def environment() -> dict[str, str]:
    """This process's environment, with the folder holding this package first on
    PYTHONPATH: SConstruct imports colibri_build, wherever it is installed."""
    here = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=here + (os.pathsep + path if path else ""))


def run(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run `scons -Q ARGS` where SConstruct is, capturing its output (text)."""
    return subprocess.run(command(*args), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=environment())
