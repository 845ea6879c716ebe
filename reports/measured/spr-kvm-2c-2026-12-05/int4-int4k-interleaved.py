"""int4 against int4k decode, one library, both dtypes timed in the same interleaved rounds
(tuner/measure/interleave.py: each round times every cell in turn in one worker)."""
import sys, json
from colibri._lib import default_library_path as find_library
from tuner.measure.interleave import interleave
from tuner.measure.problems import problem
from tuner.decide import ratio
shapes = sys.argv[1:] or ["qwen3-30b-a3b"]
probs = [problem(f"{s}/decode/{d}") for s in shapes for d in ("int4", "int4k")]
lib = str(find_library())
res = interleave([lib], probs, threads=[1, 2], weights_dir="/tmp/var/w", rounds=(10, 10), min_seconds=0.3, bandwidth=True)
out = {"lib": lib, "rounds": res.rounds, "status": res.status, "reason": res.reason, "cells": {}}
for s in shapes:
    for th in (1, 2):
        a = res.seconds[(f"{s}/decode/int4", th)][0]; b = res.seconds[(f"{s}/decode/int4k", th)][0]
        r = ratio([x / y for x, y in zip(a, b)])
        med = lambda v: sorted(v)[len(v) // 2]
        print(f"{s} decode {th} thr: int4 {med(a)*1e3:.3f} ms, int4k {med(b)*1e3:.3f} ms, int4/int4k {r.median:.3f} [{r.lo:.3f}, {r.hi:.3f}] ({r.rounds} rounds)")
        out["cells"][f"{s}/{th}"] = {"int4_s": a, "int4k_s": b, "ratio": [r.median, r.lo, r.hi]}
print("read bw GB/s per round:", {k: [round(x, 1) for x in v] for k, v in res.bandwidth.items()})
json.dump(out, open("/tmp/var/k4ab.json", "w"), indent=1)
