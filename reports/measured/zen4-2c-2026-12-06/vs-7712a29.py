"""Qwen3-shaped decode, 7712a29's default zen4 build (its own binding) against today's, each in
a process of its own, timed alternately: R rounds of N calls each, median call per round."""
import json, subprocess, sys, statistics
CHILD = r'''
import sys, time, json, numpy as np
sys.path.insert(0, sys.argv[1])
import colibri
dt, lib, T = sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = np.random.default_rng(0)
E, H, I = 128, 2048, 768
r = rng.standard_normal((E, H), dtype=np.float32) * 0.05
g = rng.standard_normal((E, I, H), dtype=np.float32) * 0.02
u = rng.standard_normal((E, I, H), dtype=np.float32) * 0.02
d = rng.standard_normal((E, H, I), dtype=np.float32) * 0.02
L = colibri.MoELayer(r, g, u, d, top_k=8, weight_dtype=dt, threads=T, lib=lib)
del g, u, d
xs = [rng.standard_normal((1, H), dtype=np.float32) for _ in range(64)]
out = np.empty((1, H), np.float32)
for x in xs: L(x, out=out)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    ts = []
    for i in range(n):
        t0 = time.perf_counter(); L(xs[i % 64], out=out); ts.append(time.perf_counter() - t0)
    ts.sort(); print(ts[len(ts) // 2], flush=True)
'''
def main():
    dt_new, dt_old, T, R = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sides = {"7712a29": ("/work/old", dt_old, "/work/old/build/zen4/libcolibri.so"),
             "today": ("/work/main", dt_new, "/work/main/build/zen4/libcolibri.so")}
    procs = {}
    for k, (root, dt, lib) in sides.items():
        p = subprocess.Popen([sys.executable, "-c", CHILD, root, dt, lib, str(T)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=root)
        assert p.stdout.readline().strip() == "ready"
        procs[k] = p
    med = {k: [] for k in procs}
    for _ in range(R):
        for k, p in procs.items():
            p.stdin.write("400\n"); p.stdin.flush()
            med[k].append(float(p.stdout.readline()))
    for p in procs.values(): p.stdin.close(); p.wait()
    ratios = sorted(a / b for a, b in zip(med["7712a29"], med["today"]))
    print(json.dumps({"dtype": dt_new, "threads": T, "rounds": R,
                      "ms_7712a29": statistics.median(med["7712a29"]) * 1e3, "ms_today": statistics.median(med["today"]) * 1e3,
                      "ratio_median": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1]}))
main()
