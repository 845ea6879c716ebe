"""Two libcolibri.so builds' int4 layer outputs compared bit for bit: python bitcmp.py A.so B.so.
Per (H, I, E, top_k) shape and token count T, each library at 1 and 2 threads; prints
"H I E k T bit-identical|DIFFER max|A - B|" (A at 1 thread against B at 1 thread)."""
import sys, numpy as np, colibri

libs = sys.argv[1:3]
rng = np.random.default_rng(0)
for H, I, E, k in [(2048, 768, 16, 4), (520, 200, 8, 2), (256, 1000, 4, 2)]:
    router = rng.standard_normal((E, H)).astype(np.float32) * 0.05
    gate = rng.standard_normal((E, I, H)).astype(np.float32) * 0.05
    up = rng.standard_normal((E, I, H)).astype(np.float32) * 0.05
    down = rng.standard_normal((E, H, I)).astype(np.float32) * 0.05
    for T in (1, 2, 3, 8, 37, 128):
        x = rng.standard_normal((T, H)).astype(np.float32)
        res = []
        for lib in libs:
            for th in (1, 2):
                L = colibri.MoELayer(router, gate, up, down, top_k=k, weight_dtype="int4", lib=lib, threads=th)
                res.append(L.forward(x) if hasattr(L, "forward") else L(x))
        same = all(np.array_equal(res[0].view(np.uint32), r.view(np.uint32)) for r in res[1:])
        print(H, I, E, k, T, "bit-identical" if same else "DIFFER", float(np.abs(res[0] - res[2]).max()))
