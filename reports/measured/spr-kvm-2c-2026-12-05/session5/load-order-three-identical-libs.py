import sys, statistics as st
from tuner.measure import interleave
from tuner.measure.problems import problem
probs = [problem(n) for n in ["qwen3-30b-a3b/prefill128/bf16", "qwen3-30b-a3b/prefill512/f32", "qwen3-30b-a3b/prefill512/bf16"]]
libs = ["/tmp/bias/liba.so", "/tmp/bias/libb.so", "/tmp/bias/libc.so"][:int(sys.argv[1])]
res = interleave.interleave(libs, probs, threads=[int(sys.argv[2])], weights_dir="build/tuner/weights",
      rounds=(6, 6), min_seconds=0.05, warmup=1, verify=[False]*len(libs))
for c in res.cells:
    meds = [st.median(x) * 1e3 for x in res.seconds[c]]
    print(c, " ".join(f"{m:7.2f}" for m in meds), " ratio lib0/others:", " ".join(f"{meds[0]/m:.3f}" for m in meds[1:]))
