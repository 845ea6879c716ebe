"""The C API called from C with bad arguments (tests/c/test_capi.c).

The program is compiled here against the library the binding would load ($COLIBRI_LIB,
the tuned library, or the default build), so the same test runs against the asan build:
when that library's build_info.json (beside it) lists -fsanitize flags, the program is
built with them and with the same compiler, as a sanitized library needs.
"""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from colibri import _lib
from tuner.fleet.verify import write_capi_model

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "c" / "test_capi.c"


def _build_settings(lib_path: Path) -> tuple[str, list[str]]:
    """(compiler, sanitizer flags) matching the library's build."""
    info_file = lib_path.parent / "build_info.json"
    cc, flags = shutil.which("cc") or shutil.which("gcc") or "cc", []
    if info_file.exists():
        info = json.loads(info_file.read_text())
        cc = (info.get("compiler") or {}).get("path") or cc
        flags = [f for f in info.get("cflags", []) + info.get("ldflags", [])
                 if f.startswith("-fsanitize") or f.startswith("-fno-sanitize")]
    return cc, list(dict.fromkeys(flags))


@pytest.fixture(scope="module")
def capi_program(tmp_path_factory):
    lib_path = Path(_lib.default_library_path()).resolve()
    if not lib_path.exists():
        pytest.fail(f"no library at {lib_path}")
    cc, san = _build_settings(lib_path)
    out = tmp_path_factory.mktemp("capi") / "test_capi"
    cmd = [cc, "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *san,
           f"-I{ROOT / 'kernels'}", str(SOURCE), "-o", str(out),
           str(lib_path), f"-Wl,-rpath,{lib_path.parent}", "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}{res.stderr}"
    return out


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    # the one `tuner verify` runs the program on (under qemu for an Arm profile)
    return write_capi_model(tmp_path_factory.mktemp("capi_model") / "m.colibri")


def test_every_entry_point_rejects_bad_arguments(capi_program, model_file, tmp_path):
    res = subprocess.run([str(capi_program), str(model_file), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    summary = re.search(r"test_capi: (\d+) checks, (\d+) failed", res.stdout)
    assert summary, f"no summary (exit {res.returncode}):\n{res.stdout}\n{res.stderr[-4000:]}"
    assert int(summary.group(1)) >= 130, res.stdout  # none skipped
    assert res.returncode == 0 and summary.group(2) == "0", f"{res.stdout}\n{res.stderr[-4000:]}"


def test_program_reports_a_bad_invocation(capi_program):
    res = subprocess.run([str(capi_program)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "usage" in res.stderr


def test_program_fails_on_a_model_it_cannot_load(capi_program, tmp_path):
    """A check that does not hold is reported and fails the run (the harness can fail)."""
    bogus = tmp_path / "not-a-model"
    bogus.write_bytes(b"\0" * 100)
    res = subprocess.run([str(capi_program), str(bogus), str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 1
    assert re.search(r"FAIL line \d+: m != NULL", res.stdout), res.stdout
