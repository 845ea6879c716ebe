"""The engine's threads under ThreadSanitizer (profile tsan: clang, LLVM's OpenMP runtime
and its Archer tool).

tests/c/test_race.c runs every weight dtype with a shared expert at 1, 2 and 4 threads on
each kernel path, with spread and with skewed routing (every token on two experts), and
an int8 model file loaded (and packed, the profile has layout_int8=interleaved) and run
at each thread count; outputs must match the 1-thread run bit for bit.

How OpenMP is handled, so that the report is real: libgomp has no TSan annotations, so
its barriers would read as races. The tsan profile builds with clang, whose -fopenmp links
LLVM's libomp, and the program runs with OMP_TOOL_LIBRARIES naming libarcher.so, the OMPT
tool that hands OpenMP's synchronisation to TSan; libomp's own code is not instrumented,
and TSan is told to ignore accesses from it (ignore_noninstrumented_modules=1, which
Archer asks for), so every report is about Colibri's code. The test requires Archer's own
banner in the output (Archer loaded and attached to a TSan process) and no TSan report.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from colibri_build import cpuinfo, scons

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "c" / "test_race.c"
NEEDS = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni"}


def _archer() -> str | None:
    """libarcher.so of the clang that builds the profile: on its library path, or in the
    LLVM lib directory above its resource directory (Debian: /usr/lib/llvm-14/lib)."""
    if shutil.which("clang") is None:
        return None
    ask = lambda flag: subprocess.run(["clang", flag], capture_output=True, text=True).stdout.strip()  # noqa: E731
    for p in (ask("-print-file-name=libarcher.so"),
              str(Path(ask("-print-resource-dir")).parents[1] / "libarcher.so")):
        if os.path.isabs(p) and os.path.exists(p):
            return p
    return None


@pytest.fixture(scope="module")
def race_program(tmp_path_factory):
    host = cpuinfo.host_cpu()
    if host.arch != "x86_64" or not NEEDS <= set(host.flags):
        pytest.skip(f"the tsan profile runs AVX-512 VNNI code; this host lacks {sorted(NEEDS - set(host.flags))}")
    archer = _archer()
    if archer is None:
        pytest.skip("clang or LLVM's Archer tool (libarcher.so, Debian: libomp-14-dev) is not "
                    "installed (`scripts/setup --test` installs them)")
    d = tmp_path_factory.mktemp("tsan")
    res = scons.run("profile=tsan", "cc=clang", f"build_dir={d / 'build'}")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lib = d / "build" / "tsan" / "libcolibri.so"
    prog = d / "test_race"
    # the TSan runtime goes into the program, which exports it to the library
    cmd = ["clang", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=thread",
           f"-I{ROOT / 'kernels'}", str(SOURCE), "-o", str(prog), str(lib),
           f"-Wl,-rpath,{lib.parent}", "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}{res.stderr}"
    return prog, archer


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory):
    import colibri

    rng = np.random.default_rng(5)
    E, I, H = 8, 64, 96
    layer = dict(router=rng.standard_normal((E, H), dtype=np.float32),
                 gate=rng.standard_normal((E, I, H), dtype=np.float32) * 0.1,
                 up=rng.standard_normal((E, I, H), dtype=np.float32) * 0.1,
                 down=rng.standard_normal((E, H, I), dtype=np.float32) * 0.1, top_k=2)
    path = tmp_path_factory.mktemp("tsan_model") / "m.colibri"
    colibri.save_model(path, [layer, layer], weight_dtype="int8")
    return path


def test_no_race_at_2_and_4_threads_and_outputs_do_not_depend_on_them(race_program, int8_model):
    prog, archer = race_program
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "OMP_NUM_THREADS", "COLIBRI_LIB")}
    env.update(OMP_TOOL_LIBRARIES=archer, ARCHER_OPTIONS="verbose=1",
               # libomp itself is not instrumented: its internals (its own allocator and locks)
               # would read as races; Archer asks for this, and our code stays fully checked
               TSAN_OPTIONS="halt_on_error=0 exitcode=66 second_deadlock_stack=1 ignore_noninstrumented_modules=1")
    res = subprocess.run([str(prog), str(int8_model)], capture_output=True, text=True, env=env, timeout=900)
    out = res.stdout + res.stderr
    assert "Archer detected OpenMP application with TSan" in out, \
        f"Archer did not attach: OpenMP's synchronisation would be invisible to TSan\n{out[-3000:]}"
    assert "ThreadSanitizer" not in out.replace("Archer detected OpenMP application with TSan", ""), out[-6000:]
    m = re.search(r"test_race: (\d+) checks, (\d+) failed", res.stdout)
    assert m and res.returncode == 0, f"exit {res.returncode}\n{out[-4000:]}"
    assert int(m.group(1)) >= 80 and m.group(2) == "0", res.stdout[-3000:]
