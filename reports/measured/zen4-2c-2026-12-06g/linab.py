# scratch: colibri.Linear decode, two libraries alternated every few calls in one process
import sys, time, numpy as np, colibri
from colibri_bench import e2e
libA, libB, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
R, C = (int(v) for v in sys.argv[4].split("x"))
pairs = int(sys.argv[5])
rng = np.random.default_rng(0)
W = rng.standard_normal((R, C), dtype=np.float32)
copies = max(1, int(4 * 32e6 // (R * C * 0.6)) + 1)  # cycle copies so the weights come from memory
A = [colibri.Linear(W, weight_dtype=dtype, threads=2, lib=libA) for _ in range(copies)]
B = [colibri.Linear(W, weight_dtype=dtype, threads=2, lib=libB) for _ in range(copies)]
x = rng.standard_normal((1, C), dtype=np.float32)
ya, yb = A[0](x), B[0](x)
assert np.array_equal(ya, yb)
ta, tb = [], []
for p in range(pairs):
    for name in (("a", "b") if p % 2 == 0 else ("b", "a")):
        L = A if name == "a" else B
        t0 = time.perf_counter()
        for i in range(10 * copies): L[i % copies](x)
        (ta if name == "a" else tb).append((time.perf_counter() - t0) / (10 * copies))
ta, tb = np.array(ta), np.array(tb); r = ta / tb
print(f"{dtype} {R}x{C} copies {copies}: A {np.median(ta)*1e6:.0f} us, B {np.median(tb)*1e6:.0f} us, A/B per pair median {np.median(r):.3f} IQR [{np.percentile(r,25):.3f}, {np.percentile(r,75):.3f}], sums {ta.sum()/tb.sum():.3f}")
