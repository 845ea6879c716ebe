"""kernels/scratch.c: a forward call's scratch is held per calling thread and reused, so a
process's memory does not grow call after call, and it goes with the thread or on request."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Measured in a process of its own: the test process's other allocations would blur it.
# Resident anonymous memory (statm's resident less its shared pages), in MB.
_SCRIPT = textwrap.dedent("""
    import json, os, resource, threading, time
    import numpy as np
    import colibri
    from colibri._lib import open_library

    def anon_mb():
        f = open("/proc/self/statm").read().split()
        return (int(f[1]) - int(f[2])) * os.sysconf("SC_PAGE_SIZE") / 1e6

    lib = open_library()
    rng = np.random.default_rng(0)
    E, H, I = 32, 512, 1024
    layer = colibri.MoELayer(rng.standard_normal((E, H), dtype=np.float32),
                             rng.standard_normal((E, I, H), dtype=np.float32) * 0.05,
                             rng.standard_normal((E, I, H), dtype=np.float32) * 0.05,
                             rng.standard_normal((E, H, I), dtype=np.float32) * 0.05,
                             top_k=4, weight_dtype="int8", threads=2)
    # token counts and routings that change from call to call, as a server's do
    xs = [rng.standard_normal((T, H), dtype=np.float32) for T in (512, 37, 300, 512, 129, 480)]
    ys = [np.empty_like(x) for x in xs]
    for x, y in zip(xs, ys):
        layer(x, out=y)
    out = {"after_first": anon_mb()}
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        for x, y in zip(xs, ys):
            layer(x, out=y)
    out["faults_per_call"] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 8 / len(xs)
    out["after_more"] = anon_mb()
    lib.colibri_release_scratch()
    out["released"] = anon_mb()
    lib.colibri_release_scratch()  # twice, and with nothing held: a no-op

    def in_a_thread():
        layer(xs[0])
        out["thread_holds"] = anon_mb()
    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join()
    # join returns once Python is done with the thread; the system thread (and with it the
    # key's destructor) ends a moment later
    for _ in range(200):
        out["thread_gone"] = anon_mb()
        if out["thread_holds"] - out["thread_gone"] > 8.0:
            break
        time.sleep(0.01)
    y = layer(xs[1])  # and the main thread allocates again
    out["again_ok"] = bool(np.isfinite(y).all())
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def memory(lib):
    # glibc's threshold fixed where it starts: every large block malloc'd is mapped afresh
    # (as in a process's first calls, before the threshold adapts to the freed blocks)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    r = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# one 512-token call's scratch: its h alone is 512 x 4 x 1024 floats, 8.4 MB
SCRATCH_MB = 8.0


def test_calls_reuse_their_scratch(memory):
    # a malloc per call took fresh pages each call here: about 1450 page faults per call
    assert memory["faults_per_call"] < 50, memory
    # and grew the tuner's Qwen3 prefill512 int8 worker by about 6 MB a call for six calls
    assert memory["after_more"] - memory["after_first"] < 1.0, memory


def test_release_frees_the_calling_threads_scratch(memory):
    assert memory["after_more"] - memory["released"] > SCRATCH_MB, memory
    assert memory["again_ok"]


def test_a_thread_that_exits_takes_its_scratch_with_it(memory):
    assert memory["thread_holds"] - memory["released"] > SCRATCH_MB, memory
    assert memory["thread_holds"] - memory["thread_gone"] > SCRATCH_MB, memory
