"""ggml (llama.cpp's CPU backend) as a peer of colibri_bench: the same MoE layer, from the
same f32 weights, in ggml's nearest weight type, timed beside Colibri in the same rounds.

ggml is built from a checkout the user names (`--ggml DIR`, a clone of
github.com/ggml-org/ggml or of llama.cpp, whose ggml/ folder is used), natively
(GGML_NATIVE, its CPU repack buffers on), into build/peers/ggml-<commit>/, and
ggml_moe.c (this folder; our own harness over ggml's public API) is compiled against it.
Nothing of ggml is kept in this tree.

Weight types: f32 -> F32, bf16 -> BF16, int8 -> Q8_0 (8.5 bits per weight), int4g32 -> Q4_0
(4.5; repacked to q4_0 8x8 on AVX2 and newer), int4 -> Q4_K (4.5; repacked 8x8). Shapes
with a shared expert or non-softmax routing are not built (the harness has neither)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "ggml_moe.c"

# ggml's enum ggml_type values (ggml.h); stable across releases since they are in GGUF files
GGML_TYPES = {"f32": ("f32", 0), "bf16": ("bf16", 30), "int8": ("q8_0", 8), "int4g32": ("q4_0", 2),
              "int4": ("q4_K", 12)}
BLOCK = {"f32": 1, "bf16": 1, "q8_0": 32, "q4_0": 32, "q4_K": 256}

CDEF = """
typedef struct gm_layer gm_layer;
gm_layer *gm_create(int H, int I, int E, int k, int T, int norm, int wtype, int copies,
                    const float *router, const float *gate, const float *up, const float *down,
                    char *err, int errlen);
void gm_free(gm_layer *L);
const char *gm_placed(const gm_layer *L);
size_t gm_expert_bytes(const gm_layer *L);
int gm_forward(gm_layer *L, const float *x, float *out, int threads);
int gm_bench(gm_layer *L, const float *xs, int nx, int threads, double min_seconds, int max_samples,
             double *samples, int *n);
"""


class GgmlError(RuntimeError):
    pass


def source_dir(path: str | Path) -> Path:
    """The ggml source folder of a ggml or llama.cpp checkout."""
    p = Path(path).expanduser().resolve()
    for cand in (p, p / "ggml"):
        if (cand / "include" / "ggml.h").is_file() and (cand / "CMakeLists.txt").is_file():
            return cand
    raise GgmlError(f"{path}: no ggml checkout here (expected include/ggml.h, or ggml/include/ggml.h "
                    "in a llama.cpp clone); git clone https://github.com/ggml-org/ggml")


def commit_of(src: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _run(cmd, log: Path, say) -> None:
    say("ggml: " + " ".join(map(str, cmd)))
    with open(log, "a") as f:
        r = subprocess.run(list(map(str, cmd)), stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        raise GgmlError(f"`{' '.join(map(str, cmd))}` failed (exit {r.returncode}); see {log}")


def build(checkout: str | Path, build_root: Path, say=print) -> tuple[Path, str]:
    """(the harness library, ggml's commit): ggml built natively with its CPU repack buffers
    and ggml_moe.c compiled against it, each step skipped when its output is newer than
    its inputs."""
    src = source_dir(checkout)
    commit = commit_of(src)
    out = Path(build_root).resolve() / f"ggml-{commit[:12]}"
    gbuild = out / "build"
    out.mkdir(parents=True, exist_ok=True)
    log = out / "build.log"
    libdir = gbuild / "src"
    if not (libdir / "libggml.so").exists():
        if not shutil.which("cmake"):
            raise GgmlError("building ggml needs cmake (apt install cmake, or pip install cmake)")
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run(["cmake", "-S", src, "-B", gbuild, *gen, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
              "-DGGML_CPU_REPACK=ON", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BUILD_TESTS=OFF",
              "-DGGML_BUILD_EXAMPLES=OFF"], log, say)
        _run(["cmake", "--build", gbuild, "-j", str(os.cpu_count() or 1)], log, say)
    so = out / "colibri_ggml_moe.so"
    if not so.exists() or so.stat().st_mtime < HARNESS.stat().st_mtime:
        _run([os.environ.get("CC", "cc"), "-O2", "-fopenmp", "-shared", "-fPIC", HARNESS,
              f"-I{src / 'include'}", f"-L{libdir}", "-lggml", "-lggml-base", "-lggml-cpu",
              f"-Wl,-rpath,{libdir}", "-o", so], log, say)
    return so, commit


_FFI = {}


def _open(so: Path):
    if so not in _FFI:
        from cffi import FFI
        ffi = FFI()
        ffi.cdef(CDEF)
        _FFI[so] = (ffi, ffi.dlopen(str(so)))
    return _FFI[so]


def unsupported(p, dtype: str) -> str | None:
    """Why the harness cannot run problem p in dtype's ggml type, or None."""
    if dtype not in GGML_TYPES:
        return f"no ggml type stands for {dtype}"
    if p.S or p.scoring != "softmax" or p.gated:
        return "the harness builds softmax-routed layers without a shared expert"
    blk = BLOCK[GGML_TYPES[dtype][0]]
    if p.H % blk or p.I % blk:
        return f"{GGML_TYPES[dtype][0]} needs rows in blocks of {blk} (H={p.H}, I={p.I})"
    return None


class GgmlLayer:
    """One layer in ggml, `copies` copies of its weights; .seconds() times calls as
    colibri_bench_layers does (inside C, median per call), .forward() runs one."""

    def __init__(self, so: Path, p, w32: dict, dtype: str, copies: int):
        why = unsupported(p, dtype)
        if why:
            raise GgmlError(why)
        self.ffi, self.lib = _open(so)
        self.p, self.type_name = p, GGML_TYPES[dtype][0]
        f = lambda a: self.ffi.from_buffer("float[]", np.ascontiguousarray(a, np.float32))  # noqa: E731
        err = self.ffi.new("char[]", 512)
        h = self.lib.gm_create(p.H, p.I, p.E, p.k, p.T, int(p.norm), GGML_TYPES[dtype][1], copies,
                               f(w32["router"]), f(w32["gate"]), f(w32["up"]), f(w32["down"]), err, 512)
        if h == self.ffi.NULL:
            raise GgmlError("ggml: " + self.ffi.string(err).decode())
        self._h = self.ffi.gc(h, self.lib.gm_free)
        self.placed = self.ffi.string(self.lib.gm_placed(h)).decode()
        self.decode_bytes = p.k * int(self.lib.gm_expert_bytes(h)) + p.E * p.H * 4

    def forward(self, x: np.ndarray, threads: int) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        out = np.empty((self.p.T, self.p.H), np.float32)
        if self.lib.gm_forward(self._h, self.ffi.from_buffer("float[]", x),
                               self.ffi.from_buffer("float[]", out), threads):
            raise GgmlError("ggml: graph compute failed")
        return out

    def seconds(self, xs: np.ndarray, threads: int, min_seconds: float) -> float:
        samples = np.empty(100_000)
        n = self.ffi.new("int *")
        xs = np.ascontiguousarray(xs, np.float32)
        if self.lib.gm_bench(self._h, self.ffi.from_buffer("float[]", xs), len(xs), threads, min_seconds,
                             len(samples), self.ffi.from_buffer("double[]", samples), n):
            raise GgmlError("ggml: graph compute failed")
        return float(np.median(samples[:n[0]]))
