# Run by hand on 2026-12-07 (README.md): decode of the bench's model files (made by
# `colibri_bench ab` or the tuner first) timed in short slices, each between two read-bandwidth
# probes, so that a slice's % of bandwidth pairs it with the window it ran in; no check of the
# outputs (scratch builds that drop work are timed too). `colibri_bench ab` now does the same
# with every round (colibri_bench/windows.py).
# python paired.py SECONDS LIB[,LIB2] PROBLEM [PROBLEM ...]   (problems: shape/decode/dtype)
import sys, time, json, statistics
import numpy as np
from colibri._lib import ffi, open_library
from colibri.model import Model
from colibri_bench.bench import read_bandwidth
from tuner.host.bandwidth import _llc_total_here, copies_for, working_set_bytes
from tuner.measure import weights
from tuner.measure.problems import problem

secs = float(sys.argv[1]); libs = sys.argv[2].split(","); probs = [problem(n) for n in sys.argv[3:]]
from colibri_build.paths import build_dir_default
wdir = build_dir_default() / "tuner" / "weights"
llc = _llc_total_here(); ws = working_set_bytes(llc)[0]
bwlib = open_library(libs[0])
cases = []
for lp in libs:
    for p in probs:
        m = Model.load(weights.model_path(wdir, p, 0, copies_for(p, llc)), lib=lp, check_crc=False)
        ptrs = ffi.new("colibri_layer *[]", [m._lib.colibri_model_layer(m._handle, i) for i in range(m.n_layers)])
        rng = np.random.default_rng(7)
        xs = rng.standard_normal((64, 1, p.H), dtype=np.float32)
        cases.append(dict(lib=lp.split("/")[-1], p=p, m=m, ptrs=ptrs, n=m.n_layers, xs=xs,
                          out=np.empty((1, p.H), np.float32), s=np.empty(4000), cnt=ffi.new("int *")))
def run(c, sec):
    lib = c["m"]._lib
    st = lib.colibri_bench_layers(c["ptrs"], c["n"], ffi.from_buffer("float[]", c["xs"]), 64, 1,
                                  ffi.from_buffer("float[]", c["out"]), 2, 3, sec, len(c["s"]),
                                  ffi.from_buffer("double[]", c["s"]), c["cnt"])
    assert st == 0
    return float(np.median(c["s"][:c["cnt"][0]]))
rows = []; end = time.time() + secs; i = 0
while time.time() < end:
    c = cases[i % len(cases)]; i += 1
    b0 = read_bandwidth(bwlib, 2, ws, min_seconds=0.1)
    t = run(c, 0.15)
    b1 = read_bandwidth(bwlib, 2, ws, min_seconds=0.1)
    gbs = c["p"].decode_bytes / t / 1e9
    rows.append(dict(lib=c["lib"], case=c["p"].name, b0=b0, b1=b1, ms=t * 1e3, gbs=gbs))
    print(f"{time.strftime('%T')} {c['lib']:10} {c['p'].name:28} bw {b0:5.1f} {b1:5.1f}  {t*1e3:6.3f} ms {gbs:5.1f} GB/s {100*gbs/max(b0,b1):5.1f}%", flush=True)
json.dump(rows, open(f"paired-{time.strftime('%H%M%S')}.json", "w"), indent=1)
print("slices with both probes >= 50 GB/s: median % of the better probe")
for lib in dict.fromkeys(r["lib"] for r in rows):
    for case in dict.fromkeys(r["case"] for r in rows):
        f = [100 * r["gbs"] / max(r["b0"], r["b1"]) for r in rows if r["lib"] == lib and r["case"] == case and min(r["b0"], r["b1"]) >= 50]
        s = [100 * r["gbs"] / max(r["b0"], r["b1"]) for r in rows if r["lib"] == lib and r["case"] == case and max(r["b0"], r["b1"]) < 40]
        print(f"  {lib:10} {case:28} fast: n={len(f)} median {statistics.median(f) if f else float('nan'):5.1f}%  | slow (<40): n={len(s)} median {statistics.median(s) if s else float('nan'):5.1f}%")
