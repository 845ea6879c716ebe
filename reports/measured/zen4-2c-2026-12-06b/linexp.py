import sys, time, numpy as np, colibri
# usage: rows cols T dtype threads libA libB [rounds]
R, C, T, dt, thr = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
libs = sys.argv[6:8]; rounds = int(sys.argv[8]) if len(sys.argv) > 8 else 4
rng = np.random.default_rng(0)
W = rng.standard_normal((R, C), dtype=np.float32) * 0.02
x = rng.standard_normal((T, C), dtype=np.float32)
Ls = [colibri.Linear(W, weight_dtype=dt, threads=thr, lib=l) for l in libs]
ts = [[], []]
for r in range(rounds):
    for i in ((0, 1) if r % 2 == 0 else (1, 0)):
        L = Ls[i]; L(x); n = 0; t0 = time.perf_counter()
        while True:
            L(x); n += 1
            if time.perf_counter() - t0 > 0.5: break
        ts[i].append((time.perf_counter() - t0) / n)
a, b = np.median(ts[0]), np.median(ts[1])
print(f"Linear {R}x{C} T={T} {dt} thr={thr}: A {a*1e3:.2f} ms  B {b*1e3:.2f} ms  A/B {a/b:.3f}")
