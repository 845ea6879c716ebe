import sys, statistics as st
from colibri._lib import open_library, ffi
from tuner.measure import worker
from tuner.measure.problems import problem
mode = sys.argv[1]
p = problem("qwen3-30b-a3b/prefill128/bf16")
libs = [open_library(f"/tmp/bias/lib{n}.so") for n in "abc"]
job = {"weights_dir": "build/tuner/weights", "seed": 0}
keep = []
if mode == "tiny":
    keep.append(worker._load_layers(libs[0], "", problem("tiny/decode/int4g32"), {"weights_dir": "/work/main/build/tuner/weights", "seed": 0}))
if mode == "sacrifice":
    keep.append(worker._load_layers(libs[0], "", p, job))   # a throwaway first load
    if len(sys.argv) > 2: keep.clear()
loaded = {}
for i in (2, 1, 0):
    loaded[i] = worker._load_layers(libs[i], "", p, job)
xs, out, samples, n = worker._timing_buffers(p, {})
res = {i: [] for i in range(3)}
for r in range(6):
    for i in worker.round_order([0, 1, 2], r):
        model, ptrs, cnt = loaded[i]
        libs[i].colibri_bench_layers(ptrs, cnt, ffi.from_buffer("float[]", xs), len(xs), p.T,
            ffi.from_buffer("float[]", out), 2, 1, 0.05, len(samples), ffi.from_buffer("double[]", samples), n)
        s = sorted(samples[:n[0]]); res[i].append(s[len(s)//2])
m = [st.median(res[i]) * 1e3 for i in range(3)]
print(mode, "loaded first: lib2;", " ".join(f"{x:.2f}" for x in m))
