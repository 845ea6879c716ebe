"""python -m colibri demo: build the engine for this host, run a Qwen3-30B-A3B-shaped
layer, check it against the float64 NumPy reference, and print what it took.

Timings here are wall-clock per call from Python (a first look, not the tuner's
measurement): decode uses a fresh token per call so the router picks different
experts and the weights come from memory, not cache.
"""
from __future__ import annotations

import json
import time

import numpy as np

from . import quant, reference
from ._lib import ffi, open_library
from .layer import MoELayer

SHAPE = dict(H=2048, I=768, E=128, k=8)  # Qwen3-30B-A3B


def _median_call(layer, xs):
    times = []
    for x in xs:
        t0 = time.perf_counter()
        layer(x)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# What the demo runs without --dtype (each checked against the float64 reference of the
# same format, as colibri.reference.compare states).
DEFAULT_DTYPES = ("f32", "bf16", "int8")


def main(dtypes=DEFAULT_DTYPES, threads=None, seed=0, as_json=False) -> int:
    """Run the demo; prints a table, or with as_json=True one JSON object. 0: all checks passed."""
    lib = open_library()
    info = json.loads(ffi.string(lib.colibri_build_info()).decode())
    say = (lambda *a, **k: None) if as_json else print
    say(f"library: profile {info.get('profile')}, kernel isa {info.get('knobs', {}).get('isa')}, "
        f"{lib.colibri_get_num_threads()} threads by default")
    H, I, E, k = SHAPE["H"], SHAPE["I"], SHAPE["E"], SHAPE["k"]
    rng = np.random.default_rng(seed)
    say(f"weights: Qwen3-30B-A3B shape (H={H}, I={I}, E={E}, top-{k}), random, "
        f"{3 * E * I * H * 4 / 1e9:.2f} GB in f32")
    router = rng.standard_normal((E, H), dtype=np.float32) * np.float32(3 / np.sqrt(H))
    mats = [rng.standard_normal(s, dtype=np.float32) * np.float32(1 / np.sqrt(s[-1]))
            for s in ((E, I, H), (E, I, H), (E, H, I))]
    x = rng.standard_normal((4, H), dtype=np.float32)
    say(f"{'dtype':6} {'check vs float64':>18} {'decode ms/token':>16} {'GB/s':>7} "
        f"{'prefill T=128 ms':>17}")
    ok = True
    rows = []
    for dt in dtypes:
        layer = MoELayer(router, *mats, top_k=k, weight_dtype=dt, threads=threads)
        ref = reference.moe_layer(x, router, *(quant.PerExpert(m, dt) for m in mats), top_k=k,
                                  act=quant.ACTIVATION_ROUNDING.get(dt))
        good, err, _ = reference.compare(layer(x), ref, dt)
        ok &= good
        tokens = [rng.standard_normal((1, H), dtype=np.float32) for _ in range(30)]
        dec = _median_call(layer, tokens)
        # k experts' share of the layer's weights (any dtype, scales included)
        bytes_per_tok = layer.weight_bytes * k / E
        pre = _median_call(layer, [rng.standard_normal((128, H), dtype=np.float32) for _ in range(3)])
        rows.append({"dtype": dt, "max_rel_err": err, "decode_ms": dec * 1e3,
                     "decode_gb_s": bytes_per_tok / dec / 1e9, "prefill_t128_ms": pre * 1e3})
        say(f"{dt:6} {err:18.2e} {dec * 1e3:16.3f} {bytes_per_tok / dec / 1e9:7.1f} "
            f"{pre * 1e3:17.1f}")
        del layer
    say("result: " + ("all checks passed" if ok else "CHECK FAILED"))
    if as_json:
        print(json.dumps({"library": info, "threads": threads or int(lib.colibri_get_num_threads()),
                          "shape": SHAPE, "results": rows, "ok": bool(ok)}, indent=1))
    return 0 if ok else 1
