"""The engine under AddressSanitizer + UBSan (scons profile=asan, scripts/sanitize).

The main test runs scripts/sanitize --quick: the engine's test modules (and any
C-level test module, test_c_*.py / test_capi*.py) in a subprocess against
build/asan/libcolibri.so with the ASan runtime preloaded, and requires a clean pass
with no sanitizer report. --quick leaves out test_layer.py::test_reference_shapes
(real model shapes: > 5 GB resident under ASan); `scripts/sanitize` runs everything.
Set COLIBRI_SANITIZE=0 to skip these tests (e.g. on a machine without libasan).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SANITIZE = ROOT / "scripts" / "sanitize"
REPORT_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "SUMMARY: AddressSanitizer",
                  "SUMMARY: UndefinedBehaviorSanitizer", "ERROR: LeakSanitizer")

pytestmark = pytest.mark.skipif(os.environ.get("COLIBRI_SANITIZE") == "0",
                                reason="COLIBRI_SANITIZE=0")


def _libasan() -> str | None:
    if shutil.which("gcc") is None:
        return None
    path = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@pytest.fixture(scope="module")
def asan_lib():
    if _libasan() is None:
        pytest.skip("gcc's AddressSanitizer runtime (libasan.so) is not installed")
    from colibri import _lib

    return _lib.build_profile("asan", quiet=True)


def _sanitize(*args, timeout=1800):
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLIBRI_LIB", "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    env["PYTHON"] = sys.executable
    t0 = time.monotonic()
    r = subprocess.run([str(SANITIZE), *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
    return r, time.monotonic() - t0


def test_asan_profile_has_address_and_undefined(asan_lib):
    from colibri_build import profiles

    flags = profiles.resolve("asan").cflags
    sanitizers = {s for f in flags if f.startswith("-fsanitize=") for s in f.split("=", 1)[1].split(",")}
    assert {"address", "undefined"} <= sanitizers
    assert "-fno-sanitize-recover=undefined" in flags  # UB aborts instead of printing a line
    assert asan_lib.exists()


def test_the_environment_catches_an_overflow(asan_lib, tmp_path):
    """Not vacuous: under scripts/sanitize's environment a heap overflow in a library
    loaded through cffi kills the process with a report."""
    src = tmp_path / "oob.c"
    src.write_text("#include <stdlib.h>\nint oob(int i) { char *p = malloc(8); p[i] = 1;"
                   " int v = p[0]; free(p); return v; }\n")
    so = tmp_path / "liboob.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-g", "-fsanitize=address,undefined", str(src),
                    "-o", str(so)], check=True)
    code = (f"import cffi; f = cffi.FFI(); f.cdef('int oob(int);'); l = f.dlopen({str(so)!r}); "
            f"l.oob(7); print('in bounds ok', flush=True); l.oob(8); print('not caught')")
    r, _ = _sanitize("--exec", sys.executable, "-c", code)
    assert "in bounds ok" in r.stdout and "not caught" not in r.stdout
    assert r.returncode != 0 and "heap-buffer-overflow" in r.stderr
    # ... and inside a pytest run the report reaches the output (pytest's default fd
    # capture would swallow it when the runtime kills the process mid-test)
    test = tmp_path / "test_oob.py"
    test.write_text(f"import cffi\ndef test_oob():\n    f = cffi.FFI(); f.cdef('int oob(int);')\n"
                    f"    f.dlopen({str(so)!r}).oob(8)\n")
    r, _ = _sanitize("--", "-q", str(test))
    assert r.returncode != 0 and "heap-buffer-overflow" in r.stdout + r.stderr


def test_binding_refuses_an_asan_library_without_the_runtime(asan_lib):
    """Without the preload, dlopen() of an ASan library would abort the interpreter;
    the binding refuses it first, with the command that works."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    env["COLIBRI_LIB"] = str(asan_lib)
    code = ("import colibri._lib as l\ntry:\n    l.open_library()\nexcept l.LibraryNotFound as e:\n"
            "    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "AddressSanitizer" in r.stdout and "LD_PRELOAD" in r.stdout


def test_engine_suite_is_clean_under_sanitizers(asan_lib):
    r, seconds = _sanitize("--quick", "--", "-q", "-x")
    out = r.stdout + r.stderr
    reports = [line for line in out.splitlines() if any(m in line for m in REPORT_MARKERS)]
    assert not reports, "sanitizer report(s):\n" + "\n".join(reports[:20]) + "\n" + out[-4000:]
    assert r.returncode == 0, f"scripts/sanitize --quick failed (exit {r.returncode}):\n{out[-6000:]}"
    assert f"{asan_lib.resolve()}," in out  # the run used the sanitizer library
    m = re.search(r"(\d+) passed", out)
    assert m and int(m.group(1)) >= 200, out[-2000:]
    assert "failed" not in out.splitlines()[-1]
    print(f"\nengine suite under ASan+UBSan: {m.group(0)} in {seconds:.0f} s")
