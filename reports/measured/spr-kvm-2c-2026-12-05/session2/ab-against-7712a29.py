"""7712a29's default sapphirerapids build against this tree's tuned library, Qwen3 decode
int8/int4, interleaved in one worker (tuner/measure/interleave.py); the model files are the
tuner's, with the header's version set to 1 (7712a29 reads only version 1; v2 adds int4k)."""
import sys, json
from tuner.measure.interleave import interleave
from tuner.measure.problems import problem
from tuner.decide import ratio
old, new, wdir, out = sys.argv[1:5]
probs = [problem(f"qwen3-30b-a3b/decode/{d}") for d in ("int8", "int4")]
res = interleave([old, new], probs, threads=[1, 2], weights_dir=wdir, rounds=(8, 8), min_seconds=0.3,
                 verify=[False, True], bandwidth=True)
print(res.status, res.reason[:300] if res.reason else "")
doc = {"old": old, "new": new, "rounds": res.rounds, "cells": {}}
for p in probs:
    for th in (1, 2):
        a, b = res.seconds[(p.name, th)]
        r = ratio([x / y for x, y in zip(a, b)])
        med = lambda v: sorted(v)[len(v) // 2]
        print(f"{p.name} {th} thr: 7712a29 {med(a)*1e3:.3f} ms, now {med(b)*1e3:.3f} ms, old/new {r.median:.3f} [{r.lo:.3f}, {r.hi:.3f}] ({r.rounds} rounds)")
        doc["cells"][f"{p.name}/{th}"] = {"old_s": a, "new_s": b, "ratio": [r.median, r.lo, r.hi]}
print("read bw GB/s per round:", {k: [round(x, 1) for x in v] for k, v in res.bandwidth.items()})
json.dump(doc, open(out, "w"), indent=1)
