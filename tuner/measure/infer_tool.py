"""kernels/tools/infer_model.c as a measuring instrument: a model file run on a budget in a
process of its own (C: a memory limit is not spent on an interpreter), optionally inside a
memory cgroup. It prints the load's and the calls' seconds and the expert cache's stats as
one JSON line, which run() returns."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from colibri_build.paths import KERNELS_DIR

SOURCE = KERNELS_DIR / "tools" / "infer_model.c"
# infer_model's arguments after BUDGET and MODE, in order (colibri_load_options; 0: the build's default)
READ_OPTIONS = ("io_threads", "read_depth", "direct_io", "policy")


def compile_tool(lib: Path, exe: Path) -> Path:
    """infer_model linked against lib."""
    cmd = [shutil.which("cc") or "gcc", "-std=c11", "-O2", f"-I{KERNELS_DIR}", str(SOURCE), "-o", str(exe),
           str(lib), f"-Wl,-rpath,{Path(lib).parent}", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr}")
    return exe


def run(exe: Path, model: Path, x: Path, T: int, out: Path, *, budget: int, mode: str, threads: int,
        reads: dict | None = None, cg: Path | None = None, timeout: float = 3600) -> tuple[int, dict | None, str]:
    """One run of infer_model on T tokens of x ([T, hidden] float32), `mode` "decode" (a call a
    token) or "all" (one call), writing the outputs to `out`, in cgroup cg when given, with
    `reads` (READ_OPTIONS' values, 0 or absent: the build's default): its exit status, its
    JSON (None when it failed) and stderr's tail."""
    reads = reads or {}
    cmd = [str(exe), str(model), str(x), str(T), str(out), str(budget), mode,
           *(str(int(reads.get(k, 0))) for k in READ_OPTIONS)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if cg is None:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    else:
        from tuner.measure import cgroup

        r = cgroup.run_in(cg, cmd, timeout=timeout, env=env)
    stats = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
    return r.returncode, stats, r.stderr[-400:]
