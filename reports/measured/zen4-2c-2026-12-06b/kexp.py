import sys, time, numpy as np, colibri
H, I = int(sys.argv[1]), int(sys.argv[2]); T = int(sys.argv[3]); dt = sys.argv[4]; thr = int(sys.argv[5])
Es = [int(e) for e in sys.argv[6].split(",")]
lib = sys.argv[7] if len(sys.argv) > 7 else None
rng = np.random.default_rng(0)
for E in Es:
    r = rng.standard_normal((E, H), dtype=np.float32)
    g = rng.standard_normal((E, I, H), dtype=np.float32) * 0.02
    u = rng.standard_normal((E, I, H), dtype=np.float32) * 0.02
    d = rng.standard_normal((E, H, I), dtype=np.float32) * 0.02
    L = colibri.MoELayer(r, g, u, d, top_k=E, weight_dtype=dt, threads=thr, lib=lib)
    x = rng.standard_normal((T, H), dtype=np.float32)
    for _ in range(3): L(x)
    best = 1e9
    for rep in range(5):
        n = 0; t0 = time.perf_counter()
        while True:
            L(x); n += 1
            el = time.perf_counter() - t0
            if el > 0.3: break
        best = min(best, el / n)
    ops = 2 * 3 * H * I * E * T
    print(f"{dt} E={E} T={T} thr={thr}: {best*1e3:.3f} ms/call, {ops/best/1e9:.0f} GOP/s, weights {3*H*I*E/1e6:.0f} MB(int8)")
    L.close()
