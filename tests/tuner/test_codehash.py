"""Machine code compared function by function (tuner/build/codehash.py): what differs is
named, what moved only because another function changed is not."""
import shutil
import subprocess
from pathlib import Path

import pytest

from tuner.build import codehash

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

SRC = """
static const float K[16] __attribute__((aligned(64))) = {%(k)s};
__attribute__((noinline)) static float helper(const float *x, int n) {
    float s = 0; for (int i = 0; i < n; ++i) s += x[i] * K[i & 15] * %(h)s; return s; }
float first(const float *x, int n) { return helper(x, n) + %(f)s; }
float second(const float *x, int n) { float s = 0; for (int i = 0; i < n; ++i) s += x[i] * 0.5f; return s; }
"""


def _obj(tmp_path: Path, name: str, **subst) -> Path:
    vals = {"k": ", ".join(f"{i}.0f" for i in range(16)), "h": "1.0f", "f": "1.0f"} | subst
    src = tmp_path / f"{name}.c"
    src.write_text(SRC % vals)
    obj = tmp_path / f"{name}.o"
    subprocess.run(["gcc", "-O2", "-fPIC", "-ffunction-sections", "-c", str(src), "-o", str(obj)],
                   check=True)
    return obj


def test_the_same_source_is_the_same_code(tmp_path):
    a = codehash.function_hashes(_obj(tmp_path, "a"))
    b = codehash.function_hashes(_obj(tmp_path, "b"))
    assert a and {"first", "second", "helper"} <= set(a)
    assert codehash.differing(a, b) == []


def test_a_changed_function_is_named_and_the_others_are_not(tmp_path):
    a = codehash.function_hashes(_obj(tmp_path, "a"))
    # helper gets another constant, which moves the constant pool: second, which does not
    # call it, is the same code (a caller may differ: gcc allocates registers across calls)
    b = codehash.function_hashes(_obj(tmp_path, "b", h="1.5f"))
    assert "helper" in codehash.differing(a, b) and "second" not in codehash.differing(a, b)
    c = codehash.function_hashes(_obj(tmp_path, "c", f="2.0f"))
    assert codehash.differing(a, c) == ["first"]


def test_a_changed_constant_table_changes_its_user(tmp_path):
    a = codehash.function_hashes(_obj(tmp_path, "a"))
    b = codehash.function_hashes(_obj(tmp_path, "b", k=", ".join(f"{i + 1}.0f" for i in range(16))))
    assert "helper" in (codehash.differing(a, b) or []) or codehash.DATA in (codehash.differing(a, b) or [])


def test_anything_else_cannot_be_compared(tmp_path):
    (tmp_path / "x.os").write_bytes(b"not an object")
    assert codehash.function_hashes(tmp_path / "x.os") is None
    assert codehash.function_hashes(tmp_path / "missing.os") is None
    assert codehash.differing(None, {}) is None
