"""The emulated AMX tile unit (kernels/amx_emu.c) against hand-computed tile products
(tests/c/test_amx_emu.c): bf16 rounding order, denormals, int8 signedness and wrap-around,
strides, and the operations the instructions refuse. The AMX kernels are verified on this
unit wherever there is no AMX (profile sapphirerapids-amx-emulated), so it must be right."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_emulated_tile_unit_matches_hand_computed_products(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / "test_amx_emu"
    cmd = [cc, "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'kernels'}",
           str(ROOT / "tests" / "c" / "test_amx_emu.c"), str(ROOT / "kernels" / "amx_emu.c"),
           "-o", str(exe), "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}{res.stderr}"
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    summary = re.search(r"test_amx_emu: (\d+) checks, (\d+) failed", res.stdout)
    assert summary, f"no summary (exit {res.returncode}):\n{res.stdout}\n{res.stderr}"
    assert int(summary.group(1)) >= 36, res.stdout
    assert res.returncode == 0 and summary.group(2) == "0", res.stdout


def test_emulated_unit_aborts_on_a_refused_operation_by_default(tmp_path):
    """Outside a test's own handler, a refused operation stops the process with its reason,
    as the instruction would fault: a kernel never runs on past a tile misuse."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "bad.c"
    src.write_text('#include "amx_tiles.h"\nint main(void) { cb_emu_zero(0); return 0; }\n')
    exe = tmp_path / "bad"
    subprocess.run([cc, "-std=c11", f"-I{ROOT / 'kernels'}", str(src),
                    str(ROOT / "kernels" / "amx_emu.c"), "-o", str(exe), "-lm"], check=True)
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert "tilezero: tiles not configured" in res.stderr
