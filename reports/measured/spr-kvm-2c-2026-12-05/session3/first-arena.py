import sys, numpy as np
from colibri_bench.bench import Mapped, time_colibri, _inputs
from colibri_build.paths import build_dir_default
from colibri._lib import current_default_build
from colibri_build import hostid
from tuner.measure import problems
lib = current_default_build(hostid.host_profile_name(), build_dir_default())
wdir = build_dir_default() / "tuner" / "weights" / "qwen3-30b-a3b-seed0"
d = sys.argv[1]; th = int(sys.argv[2]); n = int(sys.argv[3])
if len(sys.argv) > 4:  # a throwaway arena first
    junk = Mapped(wdir / f"{d}-x6.colibri", lib)  # kept alive
ms = [Mapped(wdir / f"{d}-x6.colibri", lib) for _ in range(n)]
xs = _inputs(problems.problem("qwen3-30b-a3b/decode/f32"), 64, 1)
res = [[] for _ in ms]
for r in range(8):
    order = list(range(n)); order = order[r % n:] + order[:r % n]
    for i in order:
        res[i].append(time_colibri(ms[i], xs, th, 0.25))
print(d, th, "arena times (ms):", [round(np.median(x) * 1e3, 3) for x in res],
      "ratios to the first:", [round(np.median([a / b for a, b in zip(x, res[0])]), 3) for x in res])
