import sys, numpy as np
from colibri_bench.bench import Mapped, time_colibri, _inputs
from colibri_build.paths import build_dir_default
from colibri._lib import current_default_build
from colibri_build import hostid
from tuner.measure import problems
lib = current_default_build(hostid.host_profile_name(), build_dir_default())
wdir = build_dir_default() / "tuner" / "weights" / "qwen3-30b-a3b-seed0"
mb = int(sys.argv[1])
ballast = np.ones(mb << 18, np.float32) if mb else None  # touched: its pages are taken
ms = [Mapped(wdir / "int4-x6.colibri", lib) for _ in range(2)]
xs = _inputs(problems.problem("qwen3-30b-a3b/decode/f32"), 64, 1)
res = [[] for _ in ms]
for r in range(8):
    for i in ([0, 1] if r % 2 == 0 else [1, 0]):
        res[i].append(time_colibri(ms[i], xs, 2, 0.25))
print("ballast", mb, "MB: B/A", round(np.median([b / a for a, b in zip(*res)]), 3))
