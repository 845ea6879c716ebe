"""`python -m tuner run`: probe -> profile -> space -> build -> verify+time -> store -> emit.

One knob assignment of the expert kernels is one variant. A variant is measured on
every problem of the run (decode and prefill, per dtype) in one worker process; its
cost is the geometric mean of its median times over the problems, which ranks
variants exactly as the geometric mean of their speed-ups over any baseline would.
Every (variant, problem) measurement is written to the store as soon as it exists,
keyed by its signature, so a re-run measures nothing already measured and a killed
run loses nothing it finished.
"""
from __future__ import annotations

import hashlib
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from colibri_build import hostid, profiles, render
from colibri_build.paths import build_dir_default, reports_dir_default
from tuner.build import variants
from tuner.build.signature import BuildIdentity, variant_id
from tuner.measure import problems as problems_mod, weights, worker
from tuner.search.space import Space
from tuner.store import Measurement, Store, StoreLocked

KERNEL = "expert_ffn"

# The problem classes, their knobs, their domains and the values --quick tries are data:
# templates/expert_ffn.knobs.yaml (`class`, `domain`, `quick` of each knob). Classes are
# tuned in the order they first appear there; every other knob is held at the values
# already chosen. A class is measured on the run's problems inside its domain and must
# not make any of them slower (tuner/decide.py).


def in_class(spec, p, cls: str) -> bool:
    """Problem p lies in the domain of class cls: its kernel path (decode, prefill, gemm by
    tokens per expert, problems.path_of) and its dtype are among the class's knobs'."""
    return spec.class_domain(cls).covers(problems_mod.path_of(p), p.dtype)


def default_problems(spec, shape: str = problems_mod.DEFAULT_SHAPE) -> tuple[str, ...]:
    """The problems of `shape` that cover every class's domain: each (path, dtype) cell any
    knob changes, once."""
    cells = {cell for cls in spec.classes() for cell in spec.class_domain(cls).cells()}
    ordered = [(p, d) for p in render.PATHS for d in render.DOMAIN_DTYPES if (p, d) in cells]
    return problems_mod.covering(shape, ordered)


def predefined_macros(compiler: str, cflags) -> frozenset[str] | None:
    """The macros the compiler predefines under these flags (None if it cannot say)."""
    import subprocess

    try:
        res = subprocess.run([compiler, *cflags, "-dM", "-E", "-x", "c", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return frozenset(line.split()[1] for line in res.stdout.splitlines()
                     if line.startswith("#define ") and len(line.split()) > 1)


def _current(t, m: Measurement) -> bool:
    """m was measured with this run's compiler, flags, template and engine sources (a store
    keeps the failures of older code too; they say nothing about this run's variants)."""
    try:
        return t.key(m.knobs, problems_mod.problem(m.problem)) == m.key
    except (ValueError, KeyError):
        return False


@dataclass
class RunConfig:
    profile: str | None = None
    problems: tuple[str, ...] | None = None  # None: default_problems() of the tuned shape
    strategy: str | None = None          # None: search.choose_default
    max_evals: int | None = None
    budget_s: float | None = None
    quick: bool = False
    threads: int | None = None
    min_seconds: float = 0.5             # timing per (variant, problem)
    warmup: int = 3                      # untimed calls before it
    retime_rounds: int = 6               # finalists re-timed interleaved with the default (even:
                                         # half the rounds per placement of the layers)
    finalists: int = 3
    seed: int = 0
    build_dir: Path = field(default_factory=build_dir_default)
    store_path: Path | None = None
    worker_timeout_s: float = 300.0
    emit: bool = True
    inject: dict | None = None           # tests: {vid or "*": fault} for the worker
    space_overrides: dict | None = None  # restrict knobs: {knob: [values]}
    start_points: tuple[dict, ...] = ()  # seeds for the search (e.g. from a registry)
    registry: Path | None = None         # a merged store: seed each class from its best rows
    registry_top: int = 3                # how many registry variants per class
    log: object = None                   # callable(str) for progress; default stderr
    report: bool = True                  # write the report at the end (tuner/report/__init__.py)
    report_dir: Path | None = None       # default reports/<host-id>/
    measure_bandwidth: bool = True       # probe the read bandwidth (for "% of bandwidth")
    wait: bool | float = False           # store locked by another run: False refuse, True
                                         # wait, a number wait at most that many seconds
    gate: bool = True                    # check the candidate against the default before emit
    gate_shapes: tuple[str, ...] | None = None   # None: the tuned shape(s) and one other
    gate_threads: tuple[int, ...] | None = None  # None: 1 and all threads
    gate_rounds: int = 6                 # interleaved rounds per gate cell (even, as above)
    gate_min_seconds: float = 0.2        # timing per library per round


class Tuner:
    """Holds what the pipeline's stages share for one run."""

    def __init__(self, cfg: RunConfig, host=None):
        self.cfg = cfg
        t_start = time.monotonic()
        self.say = cfg.log or (lambda m: print(f"[{time.monotonic() - t_start:5.0f} s] {m}",
                                               file=sys.stderr, flush=True))

        self.host = host if host is not None else _probe_host(cfg, self.say)
        self.profile_name = cfg.profile or hostid.host_profile_name()
        self.profile = profiles.get_profile(self.profile_name)
        self.resolved = profiles.resolve(self.profile)
        if not self.resolved.runnable_here:
            raise SystemExit(f"profile {self.profile_name} cannot run on this host "
                             f"({self.resolved.reason}); pick another with --profile")
        self.spec = render.load_knob_spec(KERNEL)
        self.template_text = render.source_text(KERNEL)
        self.default = render.resolve_knobs(self.spec, self.profile.knobs, None,
                                            self.profile.kernel_isas)
        self.all_problems = [problems_mod.problem(n)
                             for n in (cfg.problems or default_problems(self.spec))]
        self.problems = self.all_problems  # the class being tuned (set by run())
        self.work = Path(cfg.build_dir) / "tuner"
        self.store_path = Path(cfg.store_path or self.work / f"results-{self.host_id}.sqlite")
        self.store = _open_store(self.store_path, cfg.wait, self.say)
        self.strategy = None   # the search strategy of the class being tuned (recorded per row)
        self.measured = 0      # variants measured in this run (not from the store)
        self.load_checked = False
        self.from_store = 0
        self.macros = None     # the compiler's predefined macros under the profile (lazily)

    # ------------------------------------------------------------- identity
    @property
    def host_id(self) -> str:
        return self.host["host_id"]

    def key(self, knobs: dict, prob) -> str:
        return self.identity.measurement(
            knobs, dict(prob.to_dict(), threads=self.cfg.threads or os.cpu_count()))

    @property
    def identity(self) -> BuildIdentity:
        return BuildIdentity.of(self.host["fingerprint"], self.resolved, self.template_text)

    @property
    def classes(self) -> dict[str, tuple[str, ...]]:
        """Tuning class -> its knobs, in tuning order (from the knobs file)."""
        return self.spec.classes()

    def class_space(self, cls: str, base: dict) -> Space:
        """The class's knobs over their values; every other knob fixed at `base`. --quick:
        each knob's `quick` values and its default."""
        space = Space.from_spec(self.spec, self.profile.kernel_isas)
        mine = self.classes[cls]
        restrict = {k: [v] for k, v in base.items() if k not in mine}
        overrides = {k: v for k, v in (self.cfg.space_overrides or {}).items() if k in mine}
        if self.cfg.quick:
            for k in mine:
                if k not in overrides:
                    quick = {*self.spec.knobs[k].quick, self.default[k]}
                    overrides[k] = [v for v in space.knobs[k] if v in quick] or [self.default[k]]
        # knobs no template of this run declares (e.g. a test knob) stay as given
        restrict.update({k: v for k, v in (self.cfg.space_overrides or {}).items()
                         if k not in self.spec.knobs})
        restrict.update(overrides)
        return space.subspace(**restrict)

    def class_applies(self, cls: str, base: dict) -> str | None:
        """None when the class's knobs change this build's code, else why not: its knobs
        serve other isa values, or need a capability the profile's flags lack."""
        dom = self.spec.class_domain(cls)
        if dom.isas and base.get("isa") not in dom.isas:
            return f"its knobs change only isa {', '.join(dom.isas)} code (this run: isa {base.get('isa')})"
        if dom.needs:
            if self.macros is None:
                self.macros = predefined_macros(self.resolved.compiler.path,
                                                list(self.resolved.cflags)) or frozenset()
            for need in dom.needs:
                alts = self.spec.capabilities[need]
                if not any(all(m in self.macros for m in alt) for alt in alts):
                    return (f"needs {need} ({' or '.join('+'.join(a) for a in alts)}), which the "
                            f"{self.profile_name} profile's flags do not give")
        return None

    # ----------------------------------------------------------- measuring
    def cached(self, knobs: dict):
        rows = [self.store.get(self.key(knobs, p)) for p in self.problems]
        return rows if all(r is not None for r in rows) else None

    def cost(self, rows) -> float | None:
        if any(r.status != "ok" for r in rows):
            return None
        return math.exp(sum(math.log(r.median_s) for r in rows) / len(rows))

    def build(self, points: list[dict]) -> dict[str, variants.Built]:
        todo = [p for p in points if self.cached(p) is None]
        if not todo:
            return {}
        self.say(f"building {len(todo)} variant(s) with scons -j{os.cpu_count()} "
                 f"(profile {self.profile_name})")
        t0 = time.perf_counter()
        built = variants.build_batch(self.profile_name, todo, self.work / "variants")
        bad = sum(b.lib is None for b in built)
        self.say(f"built {len(built) - bad}, failed {bad} in {time.perf_counter() - t0:.1f} s")
        return {b.vid: b for b in built}

    def evaluate(self, knobs: dict, built=None) -> float | None:
        rows = self.cached(knobs)
        if rows is not None:
            self.from_store += 1
            return self.cost(rows)
        vid = variant_id(knobs)
        b = (built.get(vid) if built is not None else None) or self.build([knobs]).get(vid)
        if b is None:  # raced into the store meanwhile
            return self.cost(self.cached(knobs))
        if b.lib is None:
            rows = [self._put(knobs, p, "compile_error", b.error) for p in self.problems]
            self.say(f"  {vid}: compile error: {b.error.splitlines()[0] if b.error else ''}")
            return None
        outcomes = self.run_worker(b.lib, vid, self.cfg.min_seconds)
        rows = []
        for p, o in zip(self.problems, outcomes):
            rows.append(self._put(knobs, p, o.status, o.reason, o.samples, o.max_rel_err))
        self.measured += 1
        self.say("  " + vid + ": " + "; ".join(_fmt_row(r, p) for r, p in zip(rows, self.problems)))
        return self.cost(rows)

    def run_worker(self, lib: Path, vid: str, min_seconds: float):
        if not self.load_checked:  # once, when timing starts
            self.load_checked = True
            warning = load_warning(os.getloadavg()[0], os.cpu_count() or 1,
                                   self.cfg.threads or os.cpu_count() or 1)
            if warning:
                self.say(warning)
        job = {"lib": str(lib), "problems": [{"name": p.name} for p in self.problems],
               "weights_dir": str(self.work / "weights"), "seed": self.cfg.seed,
               "threads": self.cfg.threads, "min_seconds": min_seconds, "warmup": self.cfg.warmup}
        inject = self.cfg.inject or {}
        if vid in inject or "*" in inject:
            job["inject"] = inject.get(vid, inject.get("*"))
        return worker.measure(job, self.cfg.worker_timeout_s, worker.memory_cap(self.problems))

    def _put(self, knobs, prob, status, reason, samples=(), err=None) -> Measurement:
        med = spread = gbps = frac = None
        if samples:
            s = sorted(samples)
            med = s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])
            q1, q3 = s[len(s) // 4], s[(3 * len(s)) // 4]
            spread = (q3 - q1) / med if med else None
            if prob.T == 1:
                gbps = prob.decode_bytes / med / 1e9
                bw = self.read_bandwidth()
                frac = gbps / bw if bw else None
        m = Measurement(key=self.key(knobs, prob), kernel=KERNEL, problem=prob.name,
                        knobs=dict(knobs), status=status, reason=reason, median_s=med,
                        spread=spread, samples=len(samples), gbps=gbps, bw_fraction=frac,
                        extra={"max_rel_err": err, "gflops": (prob.flops / med / 1e9) if med else None,
                               # what a registry matches rows of other machines on
                               "compiler": self.resolved.compiler.family,
                               "compiler_version": self.resolved.version,
                               "microarchitecture": self.host.get("microarchitecture"),
                               "threads": self.cfg.threads or os.cpu_count(),
                               "strategy": self.strategy},
                        host_id=self.host_id, profile=self.profile_name, created=time.time())
        self.store.put(m)
        return m

    def read_bandwidth(self) -> float | None:
        bw = self.host.get("bandwidth") or {}
        read = bw.get("read") or {}
        n = str(self.cfg.threads or os.cpu_count())
        v = read.get(n) or read.get(int(n)) if read else None
        return float(v) if v else None


def _open_store(path: Path, wait: bool | float, say) -> Store:
    """The store with its writer lock: refuse at once (StoreLocked), or say who holds it
    and wait for it (at most `wait` seconds when a number)."""
    try:
        return Store(path, exclusive=True)
    except StoreLocked as exc:
        if wait is False or wait is None:
            raise
        say(f"{exc.holder_text()}; waiting for it"
            + (f" (at most {float(wait):g} s)" if wait is not True else "") + " ...")
        t0 = time.monotonic()
        st = Store(path, exclusive=True, wait=wait)
        say(f"results store lock acquired after {time.monotonic() - t0:.1f} s")
        return st


def load_warning(load: float, cpus: int, threads: int) -> str | None:
    """A warning when other work (the 1-minute load average) exceeds the cores the timing
    leaves free: the timed threads then share cores and the timings are noisy."""
    free = max(0, cpus - threads)
    if load <= free + 0.5:  # half a busy core: background noise of any machine
        return None
    return (f"warning: load average {load:.2f} exceeds the {free} core(s) left free by timing "
            f"at {threads} thread(s) on {cpus} CPU(s): timings at {threads} threads will be "
            f"noisy (stop other work, or pass --threads to leave cores free)")


def _fmt_row(r: Measurement, p) -> str:
    if r.status != "ok":
        return f"{p.phase}/{p.dtype} {r.status} ({r.reason.splitlines()[0] if r.reason else ''})"
    extra = f" {r.gbps:.1f} GB/s" if r.gbps else ""
    return f"{p.phase}/{p.dtype} {r.median_s * 1e3:.3f} ms{extra}"


def _probe_host(cfg: RunConfig, say) -> dict:
    from tuner.host import probe

    say("probing the host (caches, NUMA, huge pages, compilers"
        + (", memory bandwidth)" if cfg.measure_bandwidth else ")"))
    info = probe.probe(measure_bandwidth=cfg.measure_bandwidth)
    return info.to_dict()


def weights_ready(t: Tuner) -> None:
    for p in t.problems:
        weights.ensure(t.work / "weights", p, t.cfg.seed, progress=t.say)


def run(cfg: RunConfig, host: dict | None = None) -> dict:
    """The whole pipeline; returns the summary (also written as the manifest when emitting)."""
    from tuner import gate
    from tuner.build import emit

    t0 = time.perf_counter()
    t = Tuner(cfg, host)
    try:
        t.say(f"host {t.host_id}: profile {t.profile_name}, {t.resolved.compiler.family} "
              f"{t.resolved.version}; store {t.store_path}")
        weights_ready(t)
        base, classes, skipped = dict(t.default), [], []
        for cls, knobs in t.classes.items():
            t.problems = [p for p in t.all_problems if in_class(t.spec, p, cls)]
            why = "no problem of this run lies in its domain" if not t.problems else None
            why = why or t.class_applies(cls, base)
            space = t.class_space(cls, base) if why is None else None
            if space is not None and space.size() <= 1:
                why = "its knobs have one value each in this run's space: nothing to choose"
            if why:
                t.say(f"class {cls}: not tuned: {why}")
                skipped.append({"class": cls, "knobs": list(knobs), "why": why})
                continue
            missing = _uncovered(t, cls)
            if missing:
                t.say(f"class {cls}: warning: this run's problems leave part of its domain "
                      f"unmeasured ({', '.join(missing)}); the gate still checks them")
            out = _tune_class(t, cls, base)
            out["uncovered"] = missing
            classes.append(out)
            if out["winner"]:
                base = dict(out["winner"]["knobs"])
        t.problems = t.all_problems
        summary = _summary(t, classes, base, time.perf_counter() - t0)
        summary["skipped_classes"] = skipped
        if cfg.emit and summary["winner"] is not None:
            if cfg.gate:
                g = gate.run_gate(t, base, classes)
                summary["gate"] = g
                base = dict(g["knobs"])
                summary["winner"] = dict(summary["winner"], knobs=base, vid=variant_id(base),
                                         is_default=variant_id(base) == variant_id(t.default))
            summary["wall_s"] = time.perf_counter() - t0  # the gate included
            summary["emitted"] = emit.emit(
                emit.Target(Path(t.cfg.build_dir), t.profile_name, t.host, t.identity, t.say),
                base, summary)
            summary["isa_check"] = summary["emitted"]["isa_check"]
            check = summary["isa_check"]
            if check["ok"] is False:
                t.say(f"ISA CHECK FAILED: {check['library']}: {check['message']}")
            elif check["ok"] is None:
                t.say(f"warning: ISA check {check['message']}")
    finally:
        t.store.close()
    if cfg.report:
        summary["report"] = _write_report(t, summary)
    return summary


def _write_report(t: Tuner, summary: dict) -> dict:
    """The report after the run: its failure is recorded in the summary, never raised,
    so the measurements (already in the store) and the emitted files stay reported."""
    from tuner import report

    out = Path(t.cfg.report_dir or reports_dir_default() / t.host_id)
    tuned = (summary.get("emitted") or {}).get("dir") or hostid.tuned_dir(t.cfg.build_dir)
    try:
        res = report.write_report(t.store_path, tuned, out)
    except Exception as exc:  # e.g. an unwritable reports/ directory
        t.say(f"report: not written: {type(exc).__name__}: {exc}")
        return {"html": None, "md": None, "errors": [f"{type(exc).__name__}: {exc}"]}
    for e in res["errors"]:
        t.say(f"report: {e}")
    t.say(f"report: {res['html']}")
    return {"html": str(res["html"]), "md": str(res["md"]), "errors": res["errors"]}


def _uncovered(t: Tuner, cls: str) -> list[str]:
    """The class's (path, dtype) cells that no problem of the run measures."""
    have = {(problems_mod.path_of(p), p.dtype) for p in t.problems}
    return [f"{path}/{dtype}" for path, dtype in t.spec.class_domain(cls).cells()
            if (path, dtype) not in have]


def _tune_class(t: Tuner, cls: str, base: dict) -> dict:
    """Search one class's knobs on its problems, then re-time its finalists interleaved with
    the class's default and keep a finalist only when decide.verdict adopts it."""
    import random

    from tuner import search

    cfg = t.cfg
    space = t.class_space(cls, base)
    seeded = _registry_seeds(t, cls, base, space) if cfg.registry else None
    seeds = tuple(seeded["points"]) if seeded else ()
    start = [k for k in (base, *seeds, *cfg.start_points) if space.contains(k)]
    max_evals = cfg.max_evals or (space.size() if cfg.quick else None)
    if seeds and not cfg.max_evals:
        # stop once the start points (this class's base and the registry's variants)
        # are measured here: the registry's search already covered the rest
        max_evals = len({variant_id(space.normalise(k)) for k in start})
    budget = search.Budget(max_evals=max_evals, max_seconds=cfg.budget_s)
    name = cfg.strategy or search.choose_default(space, budget)
    t.strategy = name
    t.say(f"class {cls}: {', '.join(p.name for p in t.problems)}; {space.size()} variant(s), "
          f"strategy {name}, {budget}")
    # the class's default goes first (its knobs at the profile's defaults, the knobs of
    # classes already tuned at their winners): every class knows what tuning bought
    baseline = {**base, **{k: t.default[k] for k in t.classes[cls] if k in t.default}}
    default_cost = t.evaluate(baseline, t.build([baseline]))
    # exhaustive search knows its points up front: build them ahead, a chunk at a time
    ahead = start if seeds and not cfg.max_evals else list(space.points())
    prebuilt = _Ahead(t, ahead if name == "exhaustive" else [])
    result = search.STRATEGIES[name].search(space, lambda k: t.evaluate(k, prebuilt), budget,
                                            rng=random.Random(cfg.seed), start=start or None)
    retimed = _retime(t, _finalists(t, result, baseline), baseline)
    winner = _choose(t, cls, retimed)
    return {"class": cls, "knobs": list(t.classes[cls]), "problems": [p.name for p in t.problems],
            "strategy": name, "space_size": space.size(), "evaluations": result.evaluations,
            "default": baseline, "default_cost": default_cost, "finalists": retimed,
            "winner": winner, "registry": seeded}


def _choose(t: Tuner, cls: str, retimed: list[dict]) -> dict | None:
    """The finalist decide.verdict adopts with the highest median ratio; else the default
    (a tie keeps it); with no working default, the fastest finalist."""
    if not retimed:
        return None
    dflt = next((r for r in retimed if r["is_default"]), None)
    if dflt is None:
        t.say(f"class {cls}: the default failed or was not re-timed: the fastest finalist wins")
        return min(retimed, key=lambda r: r["cost"])
    adopted = [r for r in retimed if not r["is_default"] and r["verdict"]["adopt"]]
    for r in retimed:
        if r["is_default"]:
            continue
        v = r["verdict"]
        why = ("adopted" if v["adopt"] else
               f"slower on {', '.join(v['slower'])}" if v["slower"] else "not faster beyond noise")
        t.say(f"  {r['vid']}: {v['overall']['median']:.3f}x "
              f"[{v['overall']['lo']:.3f}, {v['overall']['hi']:.3f}] over the default: {why}")
    if not adopted:
        t.say(f"class {cls}: keeps its default (no finalist faster beyond noise on every problem)")
        return dflt
    return max(adopted, key=lambda r: (r["verdict"]["overall"]["median"], r["verdict"]["overall"]["lo"]))


def _registry_seeds(t: Tuner, cls: str, base: dict, space) -> dict:
    """The registry's best variants of this class for this kind of host, as points of
    `space` (the class's knobs from the registry row, every other knob from `base`)."""
    from tuner.store import registry

    tuned_elsewhere = set(t.spec.knobs) - set(t.classes[cls])
    found = registry.seed_variants(
        t.cfg.registry, kernel=KERNEL, problems=[p.name for p in t.problems],
        profile=t.profile_name, microarchitecture=t.host.get("microarchitecture"),
        compiler=t.resolved.compiler.family, compiler_version=t.resolved.version,
        top=t.cfg.registry_top, ignore=tuple(tuned_elsewhere))
    points, taken, outside = [], [], 0
    for s in found["seeds"]:
        point = {**base, **s.knobs}  # this host's choices for the other classes' knobs
        if not space.contains(point):
            outside += 1
            continue
        points.append(point)
        taken.append({"vid": variant_id(point), "registry_cost": s.cost, "hosts": list(s.hosts)})
    who = (f"profile {t.profile_name}, microarchitecture {t.host.get('microarchitecture')}, "
           f"{t.resolved.compiler.family} {registry.major(t.resolved.version)}")
    if taken:
        t.say(f"registry {t.cfg.registry}: class {cls}: {found['matching_rows']} matching row(s) "
              f"({who}); seeding with {len(taken)} variant(s):")
        for r in taken:
            t.say(f"  {r['vid']}  {r['registry_cost'] * 1e3:.3f} ms there "
                  f"(from {', '.join(r['hosts'])})")
    else:
        t.say(f"registry {t.cfg.registry}: class {cls}: nothing usable for {who} "
              f"({found['rows']} row(s) of these problems; unmatched {found['unmatched']}); "
              f"searching cold")
    if outside:
        t.say(f"  {outside} registry variant(s) lie outside this run's space: skipped")
    return {"points": points, "taken": taken, "matching_rows": found["matching_rows"],
            "unmatched": found["unmatched"], "outside_space": outside}


class _Ahead:
    """Builds of points known in advance, made a chunk at a time as the search reaches
    them: SCons compiles a chunk in parallel, and measuring starts before the whole
    space is compiled."""

    CHUNK = 16

    def __init__(self, t: Tuner, order: list[dict]):
        self.t, self.order, self.done = t, order, {}
        self.pos = {variant_id(k): i for i, k in enumerate(order)}

    def get(self, vid: str):
        if vid not in self.done and vid in self.pos:
            i = self.pos[vid]
            chunk = [k for k in self.order[i:i + self.CHUNK] if variant_id(k) not in self.done]
            self.t.say(f"[{i + 1}-{min(i + self.CHUNK, len(self.order))}/{len(self.order)}]")
            self.done.update(self.t.build(chunk))
        return self.done.get(vid)


def _finalists(t: Tuner, result, baseline: dict) -> list[dict]:
    ok = [(c, k) for k, c in result.history if c is not None]
    ok.sort(key=lambda ck: ck[0])
    out, seen = [], set()
    for c, k in ok:
        vid = variant_id(k)
        if vid not in seen:
            seen.add(vid)
            out.append(k)
        if len(out) == t.cfg.finalists:
            break
    if variant_id(baseline) not in seen and t.cached(baseline) and t.cost(t.cached(baseline)):
        out.append(baseline)
    return out


def _retime(t: Tuner, finals: list[dict], baseline: dict) -> list[dict]:
    """Finalists and the default timed again, interleaved round by round in one worker
    (A B C, B C A, ...), so that a drift of the machine hits all of them alike; the
    verdict against the default (decide.verdict) is made on these rounds.

    Kept beside the store under the hash of the finalists' signatures and the rounds: a
    re-run that found the same finalists re-measures nothing."""
    if not finals:
        return []
    import json

    h = hashlib.sha256(("".join(sorted(t.key(k, p) for k in finals for p in t.problems))
                        + f"/{t.cfg.retime_rounds}").encode())
    cache = t.store_path.with_name(f"retime-{h.hexdigest()[:20]}.json")
    if cache.exists():
        t.say(f"finalists unchanged: re-timing taken from {cache.name}")
        return json.loads(cache.read_text())
    out = _retime_measure(t, finals, baseline)
    if out:  # a re-timing where every finalist failed is not worth keeping
        render.atomic_write(cache, json.dumps(out, indent=1))
    return out


def _retime_measure(t: Tuner, finals: list[dict], baseline: dict) -> list[dict]:
    libs = [str(variants.variant_dir(t.work / "variants", t.profile_name, variant_id(k))
                / "libcolibri.so") for k in finals]
    threads = t.cfg.threads or os.cpu_count() or 1
    t.say(f"re-timing {len(finals)} variant(s) interleaved, {t.cfg.retime_rounds} round(s)")
    job = {"libs": libs, "problems": [{"name": p.name} for p in t.problems], "threads": [threads],
           "rounds": t.cfg.retime_rounds, "min_seconds": max(0.05, t.cfg.min_seconds / 2),
           "weights_dir": str(t.work / "weights"), "seed": t.cfg.seed}
    res = worker.compare(job, t.cfg.worker_timeout_s * (1 + len(finals)),
                         worker.memory_cap(t.problems) * len(finals))
    bad = [r for r in res if r["status"] != "ok"]
    if bad:  # one lib failing fails its problem for all: say which and keep none of them
        t.say("  re-timing failed: " + "; ".join(f"{r['problem']}: {r['status']} {r.get('reason', '')[:200]}"
                                                 for r in bad))
        return []
    per_lib = [[r["seconds"][i] for r in res] for i in range(len(finals))]  # [lib][problem][round]
    return retime_entries(finals, per_lib, baseline, [p.name for p in t.problems])


def retime_entries(finals: list[dict], per_lib, baseline: dict, names: list[str]) -> list[dict]:
    """One entry per re-timed variant from its rounds (per_lib[i][problem][round] seconds):
    its cost, per-problem medians, and for a non-default variant decide.verdict against
    the default."""
    from tuner import decide

    d = next((i for i, k in enumerate(finals) if variant_id(k) == variant_id(baseline)), None)
    out = []
    for i, k in enumerate(finals):
        meds = [decide._median(rounds) for rounds in per_lib[i]]
        cost = math.exp(sum(math.log(m) for m in meds) / len(meds))
        entry = {"knobs": k, "vid": variant_id(k), "cost": cost, "per_problem": meds,
                 "rounds": per_lib[i], "is_default": i == d}
        if d is not None and i != d:
            v = decide.verdict(per_lib[d], per_lib[i], names)
            entry["verdict"] = {"overall": v["overall"].to_dict(), "slower": v["slower"],
                                "adopt": v["adopt"],
                                "per_problem": {n: r.to_dict() for n, r in v["per_problem"].items()}}
        out.append(entry)
    return out


def _summary(t: Tuner, classes: list[dict], knobs: dict, wall: float) -> dict:
    rows = []
    bw = t.read_bandwidth()
    for c in classes:
        w = c["winner"]
        if not w:
            continue
        dflt = next((r for r in c["finalists"] if r["is_default"]), None)
        for i, name in enumerate(c["problems"]):
            p = problems_mod.problem(name)
            tuned = w["per_problem"][i]
            base = dflt["per_problem"][i] if dflt else None
            gbps = p.decode_bytes / tuned / 1e9 if p.T == 1 else None
            interval = ((w.get("verdict") or {}).get("per_problem") or {}).get(name)
            rows.append({"problem": p.name, "class": c["class"], "default_s": base,
                         "tuned_s": tuned, "speedup": (base / tuned) if base else None,
                         "interval": [interval["lo"], interval["hi"]] if interval else None,
                         "kept_default": bool(w.get("is_default")),
                         "gbps": gbps, "bw_fraction": (gbps / bw) if gbps and bw else None,
                         "gflops": p.flops / tuned / 1e9})
    complete = all(c["winner"] for c in classes)
    failed = [m for m in t.store.query(kernel=KERNEL, host_id=t.host_id)
              if m.status != "ok" and _current(t, m)]
    return {
        "host_id": t.host_id, "profile": t.profile_name,
        "compiler": {"family": t.resolved.compiler.family, "version": t.resolved.version,
                     "path": t.resolved.compiler.path},
        "cflags": list(t.resolved.cflags), "ldflags": list(t.resolved.ldflags),
        "notes": list(t.resolved.notes),
        "classes": classes,
        "evaluations": sum(c["evaluations"] for c in classes),
        "space_size": sum(c["space_size"] for c in classes),
        "strategy": ",".join(sorted({c["strategy"] for c in classes})) or "none",
        "measured_this_run": t.measured, "from_store": t.from_store,
        "registry": str(t.cfg.registry) if t.cfg.registry else None,
        "threads": t.cfg.threads or os.cpu_count(), "seed": t.cfg.seed,
        "min_seconds": t.cfg.min_seconds,
        "default": {"knobs": t.default},
        "winner": {"knobs": knobs, "vid": variant_id(knobs),
                   "is_default": variant_id(knobs) == variant_id(t.default)} if complete else None,
        "rows": rows,
        "failed": [{"vid": variant_id(m.knobs), "problem": m.problem, "status": m.status,
                    "reason": m.reason[:500]} for m in failed],
        "wall_s": wall, "store": str(t.store_path), "read_bandwidth_gbps": bw,
    }


def print_summary(summary: dict, out=None) -> None:
    out = out or sys.stdout  # looked up at call time: stdout may have been replaced
    w = summary.get("winner")
    print(f"\nhost {summary['host_id']}  profile {summary['profile']}  "
          f"strategy {summary['strategy']}  evaluated {summary['evaluations']} of "
          f"{summary['space_size']} (measured {summary['measured_this_run']} this run)  "
          f"{summary['wall_s']:.0f} s", file=out)
    if not w:
        print("no variant passed verification: nothing emitted", file=out)
        return
    print(f"winner {w['vid']}" + ("  (the default)" if w["is_default"] else ""), file=out)
    for c in summary.get("skipped_classes") or []:
        print(f"  class {c['class']}: not tuned: {c['why']}", file=out)
    for c in summary["classes"]:
        cw = c.get("winner") or {}
        v = cw.get("verdict")
        mine = ",".join(f"{k}={cw['knobs'][k]}" for k in c.get("knobs", []) if cw and k in cw["knobs"])
        what = (f"adopted {mine}, {v['overall']['median']:.3f}x "
                f"[{v['overall']['lo']:.3f}, {v['overall']['hi']:.3f}] over its default"
                if v and not cw.get("is_default") else "kept its default" if cw else "no winner")
        print(f"  class {c['class']}: {c['strategy']}, {c['evaluations']} of {c['space_size']} "
              f"variant(s) evaluated; {what}", file=out)
    bw = summary.get("read_bandwidth_gbps")
    # a problem appears once per class that tuned knobs on it, each row against that
    # class's own default, from the interleaved re-timing (95% interval of the ratio)
    hdr = (f"{'class':14} {'problem':32} {'default':>11} {'tuned':>11} {'speed-up':>8} "
           f"{'95% interval':>15} {'GB/s':>7} {'% of bw':>8}")
    print(hdr, file=out)
    for r in summary["rows"]:
        d = f"{r['default_s'] * 1e3:.3f} ms" if r["default_s"] else "-"
        sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        iv = (f"[{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]" if r.get("interval")
              else "(default)" if r.get("kept_default") else "-")
        g = f"{r['gbps']:.1f}" if r["gbps"] else "-"
        f = f"{100 * r['bw_fraction']:.0f}%" if r["bw_fraction"] else "-"
        print(f"{r['class']:14} {r['problem']:32} {d:>11} {r['tuned_s'] * 1e3:8.3f} ms {sp:>8} "
              f"{iv:>15} {g:>7} {f:>8}", file=out)
    gate = summary.get("gate")
    if gate:
        from tuner.gate import print_gate
        print_gate(gate, out)
    if bw:
        print(f"(% of bw: decode weight bytes per second over the measured read bandwidth, "
              f"{bw:.1f} GB/s)", file=out)
    if summary["failed"]:
        print(f"{len(summary['failed'])} failed measurement(s) recorded (see the manifest)", file=out)
    if summary.get("emitted"):
        print(f"emitted: {summary['emitted']['dir']}", file=out)
    check = summary.get("isa_check")
    if check:
        verdict = {True: "ok", False: "FAILED", None: "not checked"}[check["ok"]]
        print(f"ISA check {verdict}: {check['message']}", file=out)
    rep = summary.get("report")
    if rep and rep.get("html"):
        print(f"report: {rep['html']}" + (f" ({len(rep['errors'])} plot(s) failed)"
                                          if rep["errors"] else ""), file=out)
