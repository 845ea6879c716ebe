"""A first look at issue 32's criterion: a Qwen3-30B-A3B-shaped model of LAYERS layers in
DTYPE (default int4g32: the 4.5-bit int4 is packed at load by every build, so no build reads
it in place from the file, and a plain-mmap baseline needs the older int4g32)
(the tuner's weights, each layer its own copy of the bytes), under a memory cgroup whose
limit is a quarter of the file, with the page cache dropped before every run. It times
DECODE decode steps (kernels/tools/infer_model.c, one token a call, wall clock of the
process) three ways:
  budget  the default (packed) library with memory_budget = BUDGET_SHARE of the limit
  mmap    a library built with the stored (rows) int4 layout and no budget: the kernels
          read the experts in place from the file's mapping, and the page cache under the
          limit decides what stays (what plain mmap gives)
  packed  the default library without a budget: it packs every expert at load, so under
          the limit it is expected to be killed
Rounds alternate the ways. Prints a table and writes offload-first-look.json.
Needs root and a v1 memory cgroup (/sys/fs/cgroup/memory), as on the VMs here.
Usage: python offload-first-look.py [LAYERS] [DECODE] [ROUNDS] [DTYPE]"""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from colibri._lib import build_profile, default_library_path  # noqa: E402
from colibri_build import hostid, profiles, render  # noqa: E402
from tuner.measure.problems import problem  # noqa: E402
from tuner.measure.weights import ensure_model  # noqa: E402

LAYERS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
DECODE = int(sys.argv[2]) if len(sys.argv) > 2 else 32
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
DTYPE = sys.argv[4] if len(sys.argv) > 4 else "int4g32"
HERE = Path(__file__).resolve().parent
WORK = ROOT / "build" / "offload-first-look"
CG = Path("/sys/fs/cgroup/memory") / f"colibri-offload-{os.getpid()}"
BUDGET_SHARE = 0.85  # of the limit; the rest is the process (library, threads, scratch)

p = problem(f"qwen3-30b-a3b/decode/{DTYPE}")
model = ensure_model(ROOT / "build" / "tuner" / "weights", p, copies=LAYERS, progress=print)
size = model.stat().st_size
limit = size // 4
budget = int(limit * BUDGET_SHARE)

# the stored-layout library: the profile's knobs with int4 in rows
name = hostid.host_profile_name()
WORK.mkdir(parents=True, exist_ok=True)
knobs = dict(profiles.get_profile(name).knobs, layout_int4="rows")
cfg = render.write_config_h(WORK / "config-rows.h", knobs, signature="0", profile=name)
libs = {"packed": default_library_path().resolve(),
        "rows": Path(build_profile(name, config=cfg, build_dir=WORK / "build-rows", quiet=True)).resolve()}
exe = {}
for k, lib in libs.items():
    exe[k] = WORK / f"infer_model-{k}"
    subprocess.run(["gcc", "-std=c11", "-O2", f"-I{ROOT / 'kernels'}", str(ROOT / "kernels/tools/infer_model.c"),
                    "-o", str(exe[k]), str(lib), f"-Wl,-rpath,{lib.parent}", "-lm"], check=True)

x = np.random.default_rng(0).standard_normal((DECODE, p.H), dtype=np.float32)
(WORK / "x.bin").write_bytes(x.tobytes())


def drop_cache():
    fd = os.open(model, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def run(way):
    args = {"budget": [str(exe["packed"]), str(model), str(WORK / "x.bin"), str(DECODE), str(WORK / "y-budget.bin"),
                       str(budget), "decode"],
            "mmap": [str(exe["rows"]), str(model), str(WORK / "x.bin"), str(DECODE), str(WORK / "y-mmap.bin"), "0",
                     "decode"],
            "packed": [str(exe["packed"]), str(model), str(WORK / "x.bin"), str(DECODE), str(WORK / "y-packed.bin"),
                       "0", "decode"]}[way]
    drop_cache()
    t0 = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True, timeout=3600,
                       preexec_fn=lambda: (CG / "cgroup.procs").write_text(str(os.getpid())))
    el = time.perf_counter() - t0
    stats = json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None
    return {"way": way, "rc": r.returncode, "seconds": el, "tok_s": DECODE / el if r.returncode == 0 else None,
            "stats": stats, "stderr": r.stderr[-300:]}


CG.mkdir()
try:
    (CG / "memory.limit_in_bytes").write_text(str(limit))
    (CG / "memory.memsw.limit_in_bytes").write_text(str(limit))
    res = []
    for r in range(ROUNDS):
        for way in (["budget", "mmap"] if r % 2 == 0 else ["mmap", "budget"]) + (["packed"] if r == 0 else []):
            res.append(run(way))
            o = res[-1]
            print(f"round {r + 1}: {way:6} rc {o['rc']:3}  {o['seconds']:7.2f} s  "
                  f"{o['tok_s'] or 0:6.2f} tok/s  {json.dumps(o['stats']) if o['stats'] else o['stderr'][-120:]}",
                  flush=True)
finally:
    CG.rmdir()
med = {w: statistics.median([o["tok_s"] for o in res if o["way"] == w and o["tok_s"]] or [float("nan")])
       for w in ("budget", "mmap")}
print(f"{DTYPE} file {size / 1e9:.2f} GB ({LAYERS} layers), limit {limit / 1e6:.0f} MB, budget {budget / 1e6:.0f} MB "
      f"({budget / size:.0%} of the file); decode {DECODE} steps, page cache dropped before each run")
print(f"budget {med['budget']:.2f} tok/s, mmap {med['mmap']:.2f} tok/s: {med['budget'] / med['mmap']:.2f}x")
(HERE / "offload-first-look.json").write_text(json.dumps(
    {"dtype": DTYPE, "file_bytes": size, "layers": LAYERS, "limit": limit, "budget": budget, "decode": DECODE, "runs": res,
     "median_tok_s": med}, indent=1))
