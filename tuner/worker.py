"""One variant, measured in a child process: verify against the NumPy reference, then
time inside C. A variant that crashes, hangs, eats memory or computes wrong costs
its own result, never the tuner run.

Parent side: `measure(job, timeout_s)` runs `python -m tuner.worker` with the job as
JSON on stdin, under a timeout and an address-space cap, and reads one JSON line
per problem from its stdout (so the problems finished before a crash still count).
Child side: `main()`.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

STATUS_OK, STATUS_WRONG, STATUS_CRASH, STATUS_TIMEOUT, STATUS_ERROR = (
    "ok", "wrong", "crash", "timeout", "error")


@dataclass(frozen=True)
class Outcome:
    problem: str
    status: str
    reason: str = ""
    samples: tuple[float, ...] = ()
    max_rel_err: float | None = None


# ---------------------------------------------------------------- parent side

def _limit(mem_bytes: int | None):
    def apply():
        os.setsid()  # own process group: a timeout kills OpenMP threads' process too
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file
    return apply


def measure(job: dict, timeout_s: float, mem_bytes: int | None = None) -> list[Outcome]:
    """Run one job (one library, several problems); one Outcome per problem."""
    problems = [p["name"] for p in job["problems"]]
    proc = subprocess.Popen([sys.executable, "-m", "tuner.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_limit(mem_bytes), env=dict(os.environ, PYTHONHASHSEED="0"))
    try:
        out, err = proc.communicate(json.dumps(job), timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    done = {}
    for line in out.splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        done[d["problem"]] = Outcome(d["problem"], d["status"], d.get("reason", ""),
                                     tuple(d.get("samples", ())), d.get("max_rel_err"))
    if timed_out:
        why = f"timed out after {timeout_s:.0f} s"
        status = STATUS_TIMEOUT
    elif proc.returncode < 0:
        sig = -proc.returncode
        why = f"killed by signal {sig} ({signal.Signals(sig).name})"
        if sig in (signal.SIGKILL,) and mem_bytes:
            why += f"; memory cap {mem_bytes >> 20} MiB"
        status = STATUS_CRASH
    elif proc.returncode != 0:
        tail = err.strip().splitlines()[-3:]
        why = f"worker exited with {proc.returncode}: " + " | ".join(tail)
        status = STATUS_CRASH if "MemoryError" not in err else STATUS_ERROR
    else:
        why, status = "worker ended without a result", STATUS_ERROR
    return [done.get(p) or Outcome(p, status, why) for p in problems]


# ----------------------------------------------------------------- child side

def _emit(**d) -> None:
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()


def _run_problem(lib, pd: dict, job: dict) -> None:
    import numpy as np

    from colibri import quant, reference
    from colibri._lib import ffi
    from colibri.layer import MoELayer

    from . import weights
    from .problems import problem

    p = problem(pd["name"])
    seed = job.get("seed", 0)
    enc = weights.load_encoded(job["weights_dir"], p, seed)
    sh = enc.pop("shared_expert_gate", (None, None))[0]
    router = enc.pop("router")[0]
    route = dict(top_k=p.k, scoring=p.scoring, norm_topk_prob=p.norm)
    layer = MoELayer.from_encoded(router, enc, weight_dtype=p.dtype, shared_expert_gate=sh,
                                  threads=job.get("threads"), lib=job["lib"], **route)
    # 1. verify against the float64 reference: the real shape at T=1 (decode kernels),
    # then a small ragged layer whose experts get many tokens (prefill kernels too);
    # the kernels are not specialised by shape, so together they cover the variant.
    f32 = weights.load(job["weights_dir"], p, seed)
    shared = {n: (f32[n] if n == "shared_expert_gate" else quant.roundtrip(f32[n], p.dtype))
              for n in weights.SHARED if n in f32}
    x = reference.inputs_with_margin(router, 1, seed=1, **route)
    ref = reference.moe_layer(x, router, *(quant.PerExpert(f32[n], p.dtype)
                                           for n in ("gate", "up", "down")), **route, **shared)
    checks = [(f"{p.shape} T=1", layer(x), ref)] + _small_checks(job["lib"], p)
    worst = 0.0
    for what, out, ref in checks:
        if not np.all(np.isfinite(out)):
            _emit(problem=p.name, status=STATUS_WRONG, reason=f"non-finite output ({what})")
            return
        scale = np.abs(ref) + np.mean(np.abs(ref), axis=-1, keepdims=True)
        rel = float(np.max(np.abs(out - ref) / scale))
        worst = max(worst, rel)
        if rel > job.get("rtol", 1e-4):
            _emit(problem=p.name, status=STATUS_WRONG, max_rel_err=rel,
                  reason=f"max relative error {rel:.3g} > {job.get('rtol', 1e-4):g} ({what})")
            return
    # 2. time inside C, fresh inputs per call (decode: other experts each call)
    rng = np.random.default_rng(seed + 7)
    n_inputs = max(1, job.get("inputs_per_problem", 64) // p.T)
    xs = rng.standard_normal((n_inputs, p.T, p.H), dtype=np.float32)
    out = np.empty((p.T, p.H), np.float32)
    max_samples = job.get("max_samples", 2000)
    samples = np.empty(max_samples, np.float64)
    n = ffi.new("int *")
    st = lib.colibri_bench_layer(layer._ptr, ffi.from_buffer("float[]", xs), n_inputs, p.T,
                                 ffi.from_buffer("float[]", out), layer.threads,
                                 job.get("warmup", 3), job.get("min_seconds", 0.5), max_samples,
                                 ffi.from_buffer("double[]", samples), n)
    if st:
        from colibri._lib import last_error
        _emit(problem=p.name, status=STATUS_ERROR, reason=f"bench failed: {last_error(lib)}")
        return
    _emit(problem=p.name, status=STATUS_OK, samples=samples[:n[0]].tolist(), max_rel_err=worst)


def _small_checks(lib_path: str, p) -> list[tuple[str, object, object]]:
    """(what, engine output, float64 reference) on a small ragged layer in p's dtype, with
    1, 2 and 40 tokens over 6 experts: decode-class and prefill-class kernels both run."""
    import numpy as np

    from colibri import quant, reference
    from colibri.layer import MoELayer

    rng = np.random.default_rng(12345)
    H, I, E, k, S = 200, 72, 6, 2, (40 if p.S else 0)
    w = lambda *sh: rng.standard_normal(sh, dtype=np.float32) * np.float32(1 / np.sqrt(sh[-1]))
    router = w(E, H) * np.float32(3)
    gate, up, down = w(E, I, H), w(E, I, H), w(E, H, I)
    sh = dict(shared_gate=w(S, H), shared_up=w(S, H), shared_down=w(H, S),
              shared_expert_gate=w(H)) if S else {}
    route = dict(top_k=k, scoring=p.scoring, norm_topk_prob=p.norm)
    layer = MoELayer(router, gate, up, down, weight_dtype=p.dtype, lib=lib_path, **route, **sh)
    rt = {n: (v if n == "shared_expert_gate" else quant.roundtrip(v, p.dtype)) for n, v in sh.items()}
    out = []
    for T in (1, 2, 40):
        x = reference.inputs_with_margin(router, T, seed=T, **route)
        ref = reference.moe_layer(x, router, *(quant.PerExpert(a, p.dtype) for a in (gate, up, down)),
                                  **route, **rt)
        out.append((f"small ragged layer T={T}", layer(x), ref))
    return out


def main() -> int:
    job = json.loads(sys.stdin.read())
    from colibri._lib import open_library

    lib = open_library(job["lib"])
    if job.get("inject"):  # fault injection for the tuner's own tests
        _inject(job["inject"])
    for pd in job["problems"]:
        t0 = time.perf_counter()
        _run_problem(lib, pd, job)
        print(f"{pd['name']}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _inject(kind: str) -> None:
    """Test-only faults of the worker process itself (the C-level ones live in templates)."""
    if kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "hang":
        time.sleep(3600)
    elif kind == "oom":
        blocks = []
        while True:
            blocks.append(bytearray(1 << 28))


if __name__ == "__main__":
    sys.exit(main())
