# Mixtral f32 decode from the bench's model file (its mapped pages) against the same weights
# copied into a layer's own pool (colibri.MoELayer, huge pages), interleaved, one token a call.
# A scratch script, run by hand on 2026-12-07 (README.md):
#   python file-vs-pool.py LIB THREADS WEIGHTS_DIR   (WEIGHTS_DIR: the bench's
#   build/tuner/weights/mixtral-8x7b-seed0/, with f32-x1.colibri and the *.f32.npy files)
import sys, time, numpy as np, colibri
from colibri._lib import ffi
lib = sys.argv[1]; nt = int(sys.argv[2]); W = sys.argv[3].rstrip("/") + "/"
m = colibri.Model.load(W + "f32-x1.colibri", lib=lib, check_crc=False)
print("file layer:", m.layer_page_kind(0), m.layer_kernels(0))
ld = lambda n: np.load(W + n + ".f32.npy", mmap_mode="r")
L = colibri.MoELayer(ld("router"), ld("gate"), ld("up"), ld("down"), top_k=2, weight_dtype="f32", lib=lib, threads=nt)
print("pool layer:", L.page_kind)
C = L._lib
lf, lp = m._layer(0), L._live()
rng = np.random.default_rng(0); xs = [rng.standard_normal((1, 4096), dtype=np.float32) for _ in range(16)]
y = np.empty((1, 4096), np.float32)
def run(h, n=16):
    t0 = time.perf_counter()
    for i in range(n): assert C.colibri_layer_forward(h, ffi.from_buffer("float[]", xs[i % 16]), ffi.from_buffer("float[]", y), 1, nt) == 0
    return (time.perf_counter() - t0) / n
res = {"file": [], "pool": []}
for r in range(8):
    if r % 2: res["file"].append(run(lf)); res["pool"].append(run(lp))
    else: res["pool"].append(run(lp)); res["file"].append(run(lf))
for k, v in res.items(): print(k, "ms median %.2f" % (1e3 * np.median(v)), ["%.1f" % (1e3 * x) for x in v])
print("pool/file speed", np.median(res["file"]) / np.median(res["pool"]))
