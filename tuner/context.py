"""What the stages of one tuning run share (tuner/run.py drives them): the host, the
profile and its defaults, the knob classes and their spaces, the results store and the
measurement of one variant (build, compare its machine code with its class's default,
verify and time it in a worker).

One knob assignment of the expert kernels is one variant. A variant is measured on
every problem of its class in one worker process; its cost is the geometric mean of its
median times over the problems, which ranks variants exactly as the geometric mean of
their speed-ups over any baseline would. Every (variant, problem) measurement is written
to the store as soon as it exists, keyed by its signature, so a re-run measures nothing
already measured and a killed run loses nothing it finished.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

from colibri import quant
from colibri_build import hostid, parts, profiles, render, shapes
from tuner.build import codehash, variants
from tuner.build.signature import BuildIdentity, variant_id
from tuner.measure import interleave, problems as problems_mod, worker
from tuner.search.space import Space
from tuner.store import Measurement, Store, StoreLocked

KERNEL = "expert_ffn"

# The problem classes, their knobs, their domains and the values --quick tries are data:
# templates/expert_ffn.knobs.yaml (`class`, `domain`, `quick` of each knob). Classes are
# tuned in the order they first appear there; every other knob is held at the values
# already chosen. A class is measured on the run's problems inside its domain and must
# not make any of them slower (tuner/decide.py).


def in_class(spec, p, cls: str, knobs=None, amx: bool = False) -> bool:
    """Problem p lies in the domain of class cls: its kernel path under `knobs` on a build
    with AMX tiles or not (decode, prefill, gemm by tokens per expert, problems.path_of)
    and its dtype are among the class's knobs'."""
    return spec.class_domain(cls).covers(problems_mod.path_of(p, knobs, amx), p.part)


def timed_dtype(spec, cls: str, path: str, part: str) -> str:
    """The weight dtype class cls is timed on in its (path, part) cell
    (colibri_build.parts.timed_dtype)."""
    return parts.timed_dtype(part, path, spec.class_domain(cls).paths)


def timed_problems(spec, cls: str, probs: list, cell) -> list:
    """Of class cls's problems, those it is timed on: where the run covers a (path, part)
    cell (cell(p)) in the dtype the class is timed on there (timed_dtype), that dtype's
    only (the int4 part: int4 or int4g32); a cell covered only in another dtype (problems a
    user named) keeps its problems."""
    timed = {cell(p) for p in probs if p.dtype == timed_dtype(spec, cls, *cell(p))}
    return [p for p in probs if cell(p) not in timed or p.dtype == timed_dtype(spec, cls, *cell(p))]


def default_problems(spec, shape: str = problems_mod.DEFAULT_SHAPE) -> tuple[str, ...]:
    """The problems of `shape` that cover every class's domain: each (path, dtype) cell any
    knob changes, once, in the weight dtype that class is timed on there."""
    cells = {(p, timed_dtype(spec, cls, p, d)) for cls in spec.classes()
             for p, d in spec.class_domain(cls).cells()}
    ordered = [(p, d) for p in render.PATHS for d in quant.DTYPES if (p, d) in cells]
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


class Tuner:
    """Holds what the pipeline's stages share for one run."""

    def __init__(self, cfg, host=None):
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
        # the default build: the base knobs, and the profile's own shape classes (promoted
        # from the fleet) -- what `scons profile=<p>` builds
        self.default_assignment = shapes.join(self.default, {
            sc: {k: v for k, v in over.items() if k in self.spec.knobs}
            for sc, over in self.profile.shapes.items()})
        self.current_shape = None  # the shape class being tuned
        names = cfg.problems or [n for shape in (cfg.shapes or (problems_mod.DEFAULT_SHAPE,))
                                 for n in default_problems(self.spec, shape)]
        self.all_problems = [problems_mod.problem(n) for n in dict.fromkeys(names)]
        self.problems = self.all_problems  # the class being tuned (set by run())
        self.baseline = None   # the class's default while a class is tuned: (knobs, code hashes)
        self.identical: dict[str, str] = {}  # vid -> the default's vid it has the machine code of
        # (problem name, problem_code digest) -> the knobs of the variant timed with that code
        self.timed_code: dict[tuple[str, str], dict] = {}
        self.work = Path(cfg.build_dir) / "tuner"
        self.store_path = Path(cfg.store_path or self.work / f"results-{self.host_id}.sqlite")
        self.store = _open_store(self.store_path, cfg.wait, self.say)
        self.strategy = None   # the search strategy of the class being tuned (recorded per row)
        self.current_class = None  # the knob class being tuned
        self.measured = 0      # variants measured in this run (not from the store)
        self.load_checked = False
        self.from_store = 0
        self.macros = None     # the compiler's predefined macros under the profile (lazily)
        self.built: dict[str, variants.Built] = {}  # variant id -> its build in this run
        self.verified: set[tuple[str, str, str]] = set()  # (variant id, shape, dtype) checked

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

    def default_for(self, sc: str | None = None) -> dict:
        """The knobs the default build runs for layers of shape class `sc` (the base knobs
        with the profile's values for that class)."""
        return shapes.for_class(self.default_assignment, sc) if sc else dict(self.default)

    def start_for(self, sc: str | None = None) -> dict:
        """Where tuning shape class `sc` starts: its default knobs, with the knobs that
        --space pins to one value at that value (whichever class they belong to)."""
        pins = {k: v[0] for k, v in (self.cfg.space_overrides or {}).items()
                if len(v) == 1 and k in self.spec.knobs}
        return {**self.default_for(sc), **pins}

    def shape_groups(self) -> dict[str, list]:
        """Shape class (colibri_build/shapes.py) -> the run's problems of shapes in it."""
        out: dict[str, list] = {}
        for p in self.all_problems:
            out.setdefault(shapes.class_of(p.H, p.I), []).append(p)
        return out

    def class_space(self, cls: str, base: dict) -> Space:
        """The class's knobs over their values; every other knob fixed at `base`. --quick:
        each knob's `quick` values and its default, one knob off its default at a time."""
        space = Space.from_spec(self.spec, self.profile.kernel_isas)
        mine = self.classes[cls]
        restrict = {k: [v] for k, v in base.items() if k not in mine}
        overrides = {k: v for k, v in (self.cfg.space_overrides or {}).items() if k in mine}
        if self.cfg.quick:
            for k in mine:
                if k not in overrides:
                    dflt = self.default_for(self.current_shape)[k]
                    quick = {*self.spec.knobs[k].quick, dflt}
                    overrides[k] = [v for v in space.knobs[k] if v in quick] or [dflt]
        # knobs no template of this run declares (e.g. a test knob) stay as given
        restrict.update({k: v for k, v in (self.cfg.space_overrides or {}).items()
                         if k not in self.spec.knobs})
        restrict.update(overrides)
        # a knob whose own code is for another isa or needs what the flags lack cannot
        # change this build: it stays at its default (gemm_mmla_int8 on x86)
        restrict.update({k: [self.default_for(self.current_shape)[k]] for k in mine
                         if self._domain_excludes(self.spec.knobs[k].domain, base)})
        space = space.subspace(**restrict)
        if self.cfg.quick:
            # one quick value at a time against the default (knobs --space names excepted):
            # most classes then have no more candidates than the race takes, and go to it
            # without a screening pass
            try:
                space = space.one_at_a_time(self.start_for(self.current_shape),
                                            [k for k in mine if k not in (self.cfg.space_overrides or {})])
            except ValueError:  # no point near the default (a constraint with other knobs)
                pass            # the product of the quick values, as it is
        return space

    def class_applies(self, cls: str, base: dict) -> str | None:
        """None when the class's knobs change this build's code, else why not: its knobs
        serve other isa values, or need a capability the profile's flags lack."""
        return self._domain_excludes(self.spec.class_domain(cls), base)

    def _domain_excludes(self, dom, base: dict) -> str | None:
        if dom.isas and base.get("isa") not in dom.isas:
            return f"its knobs change only isa {', '.join(dom.isas)} code (this run: isa {base.get('isa')})"
        if dom.layout:
            held = {d: self.layouts_of(d, base) for d in dom.dtypes}
            if all(dom.layout not in v for v in held.values()):
                return (f"its knobs change only the {dom.layout} layout's kernels, and this build holds "
                        + ", ".join(f"{d} {'/'.join(sorted(v))}" for d, v in held.items()))
        if dom.needs:
            if self.macros is None:
                self.macros = predefined_macros(self.resolved.compiler.path,
                                                list(self.resolved.cflags)) or frozenset()
            for need in dom.needs:
                alts = self.spec.isas[base.get("isa")].capabilities[need]
                if not any(all(m in self.macros for m in alt) for alt in alts):
                    return (f"needs {need} ({' or '.join('+'.join(a) for a in alts)}), which the "
                            f"{self.profile_name} profile's flags do not give")
        return None

    def live_cells(self, cls: str, base: dict) -> set:
        """The (path, dtype) cells of the class's domain where one of its knobs changes code
        that runs under `base`: a knob whose flags or isa exclude it has none, and one of a
        layout's kernels only the dtypes held in that layout."""
        cells = set()
        paths = {p for name in self.classes[cls] for p in self.spec.knobs[name].domain.paths}
        for name in self.classes[cls]:
            dom = self.spec.knobs[name].domain
            if self._domain_excludes(dom, base):
                continue
            cells |= {(p, d) for p, d in dom.cells()
                      if not dom.layout or dom.layout in self.layouts_of(d, base, parts.timed_dtype(d, p, paths))}
        return cells

    @property
    def amx(self) -> bool:
        """Whether this run's builds have AMX tiles (the profile's flags give them)."""
        knob = self.spec.knobs.get("amx_bf16")
        return knob is not None and self._domain_excludes(knob.domain, self.default) is None

    def layouts_of(self, part: str, base: dict, dtype: str | None = None) -> set[str]:
        """The layouts part's matrices are held in under `base`, in weight dtype `dtype`
        or in any dtype the part serves: where the part's layout knob changes this build's
        code (a packed layout needs its capability), that knob's value, or the dtype's
        fixed layout (parts.FIXED_LAYOUT: int4 is packed whatever layout_int4 says); else
        rows."""
        knob = self.spec.knobs.get(f"layout_{part}")
        if knob is None or self._domain_excludes(knob.domain, base):
            return {"rows"}
        dtypes = (dtype,) if dtype else parts.hosted_dtypes(part)
        return {parts.FIXED_LAYOUT.get(d) or base.get(knob.name, knob.default) for d in dtypes}

    # ----------------------------------------------------------- measuring
    def cached(self, knobs: dict):
        rows = [self.store.get(self.key(knobs, p)) for p in self.problems]
        return rows if all(r is not None for r in rows) else None

    def cost(self, rows) -> float | None:
        if not rows or any(r.status != "ok" for r in rows):
            return None
        return math.exp(sum(math.log(r.median_s) for r in rows) / len(rows))

    def build(self, points: list[dict], force: str | None = None) -> dict[str, variants.Built]:
        """Build the points the store has no measurements of (and `force`, a variant id,
        in any case); {variant id: Built}."""
        todo = [p for p in points if variant_id(p) == force or self.cached(p) is None]
        # built earlier in this run (its sources cannot have changed since): not again
        out = {variant_id(p): self.built[variant_id(p)] for p in todo if variant_id(p) in self.built}
        todo = [p for p in todo if variant_id(p) not in out]
        if not todo:
            return out
        self.say(f"building {len(todo)} variant(s) with scons -j{os.cpu_count()} "
                 f"(profile {self.profile_name})")
        t0 = time.perf_counter()
        built = variants.build_batch(self.profile_name, todo, self.work / "variants")
        bad = sum(b.lib is None for b in built)
        self.say(f"built {len(built) - bad}, failed {bad} in {time.perf_counter() - t0:.1f} s")
        self.built.update({b.vid: b for b in built})
        return {**out, **{b.vid: b for b in built}}

    def label(self, knobs: dict) -> str:
        """The knobs of the class being tuned (all of them outside a class), for progress lines."""
        mine = self.classes.get(self.current_class or "", ()) or tuple(knobs)
        return ",".join(f"{k}={knobs[k]}" for k in sorted(mine) if k in knobs)

    def code(self, knobs: dict) -> dict | None:
        """The machine code of a built variant's kernels, function by function (None if it
        cannot be read)."""
        return variants.kernel_code(self.work / "variants", self.profile_name, variant_id(knobs))

    def same_code_as_baseline(self, knobs: dict) -> bool:
        """Whether a built variant has its class default's machine code in every function:
        then it cannot be faster or slower, and is not timed."""
        if self.baseline is None or variant_id(knobs) == variant_id(self.baseline[0]):
            return False
        return codehash.differing(self.baseline[1], self.code(knobs)) == []

    def tie_with_baseline(self, knobs: dict) -> bool:
        """Whether a built variant has the class default's machine code; if so it is
        recorded as a tie, never timed."""
        if not self.same_code_as_baseline(knobs):
            return False
        self.identical[variant_id(knobs)] = variant_id(self.baseline[0])
        self.say(f"  {self.label(knobs)}: the default's machine code: a tie, not timed")
        return True

    def same_problem_code_as_baseline(self, knobs: dict) -> bool:
        """Whether a built variant runs its class default's machine code on every problem of
        the class (it differs only in code no problem of this run reaches): timing it could
        only measure noise."""
        if self.baseline is None:
            return False
        base = [self.problem_code(self.baseline[0], p) for p in self.problems]
        return None not in base and base == [self.problem_code(knobs, p) for p in self.problems]

    def problem_code(self, knobs: dict, prob) -> str | None:
        """A digest of the machine code problem `prob` runs in a built variant: its dtype's
        kernel part and the f32 part (the router's gemm); None when it cannot be read."""
        code = self.code(knobs)
        if code is None:
            return None
        mine = {"f32", parts.part_of(prob.dtype)}
        items = sorted((k, v) for k, v in code.items() if k.split(":", 1)[0] in mine)
        return hashlib.sha256(json.dumps(items).encode()).hexdigest()

    def _note_timed(self, knobs: dict, rows) -> None:
        """Remember the code each ok row of a built variant was timed with."""
        for p, r in zip(self.problems, rows):
            if r is not None and r.status == "ok" and not r.extra.get("same_code_as"):
                digest = self.problem_code(knobs, p)
                if digest is not None:
                    self.timed_code.setdefault((p.name, digest), knobs)

    def _same_code_row(self, knobs: dict, prob):
        """The store's row of another variant timed in this run on `prob` with the machine
        code this variant runs there, copied under this variant's key; None if there is none."""
        digest = self.problem_code(knobs, prob)
        src = self.timed_code.get((prob.name, digest)) if digest is not None else None
        row = self.store.get(self.key(src, prob)) if src is not None else None
        if row is None or row.status != "ok":
            return None
        m = dataclasses.replace(row, key=self.key(knobs, prob), knobs=dict(knobs), created=time.time(),
                                reason=f"the machine code of {variant_id(src)} on this problem: its timing",
                                extra={**row.extra, "same_code_as": variant_id(src)})
        self.store.put(m)
        return m

    def evaluate(self, knobs: dict, built=None) -> float | None:
        rows = self.cached(knobs)
        if rows is not None:
            self.from_store += 1
            if self.baseline is not None:  # a built variant's code can serve the others
                self._note_timed(knobs, rows)
            return self.cost(rows)
        vid = variant_id(knobs)
        b = (built.get(vid) if built is not None else None) or self.build([knobs]).get(vid)
        if b is None:  # raced into the store meanwhile
            return self.cost(self.cached(knobs))
        if b.lib is None:
            rows = [self._put(knobs, p, "compile_error", b.error) for p in self.problems]
            self.say(f"  {self.label(knobs)}: compile error: {b.error.splitlines()[0] if b.error else ''}")
            return None
        if self.tie_with_baseline(knobs):
            return self.cost(self.cached(self.baseline[0]) or [])
        # a problem whose code another variant of this run was timed with is not timed again
        rows = [self._same_code_row(knobs, p) for p in self.problems]
        todo = [p for p, r in zip(self.problems, rows) if r is None]
        outcomes = iter(self.run_worker(b.lib, vid, self.cfg.min_seconds, todo) if todo else ())
        rows = [r if r is not None else self._put(knobs, p, *_outcome_fields(next(outcomes)))
                for p, r in zip(self.problems, rows)]
        self._note_timed(knobs, rows)
        self.measured += 1
        self.say(f"  {self.label(knobs)}: " + "; ".join(_fmt_row(r, p) for r, p in zip(rows, self.problems)))
        return self.cost(rows)

    def run_worker(self, lib: Path, vid: str, min_seconds: float, problems=None):
        problems = list(self.problems if problems is None else problems)
        if not self.load_checked:  # once, when timing starts
            self.load_checked = True
            warning = load_warning(os.getloadavg()[0], os.cpu_count() or 1,
                                   self.cfg.threads or os.cpu_count() or 1)
            if warning:
                self.say(warning)
        interleave.prepare(problems, self.work / "weights", self.cfg.seed, self.say)
        job = {"lib": str(lib), "problems": [{"name": p.name} for p in problems],
               "weights_dir": str(self.work / "weights"), "seed": self.cfg.seed,
               "threads": self.cfg.threads, "min_seconds": min_seconds, "warmup": self.cfg.warmup}
        inject = self.cfg.inject or {}
        if vid in inject or "*" in inject:
            job["inject"] = inject.get(vid, inject.get("*"))
        return worker.measure(job, self.cfg.worker_timeout_s, worker.memory_cap(problems))

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


def _outcome_fields(o) -> tuple:
    return o.status, o.reason, o.samples, o.max_rel_err


def _fmt_row(r: Measurement, p) -> str:
    if r.status != "ok":
        return f"{p.phase}/{p.dtype} {r.status} ({r.reason.splitlines()[0] if r.reason else ''})"
    extra = f" {r.gbps:.1f} GB/s" if r.gbps else ""
    same = " (machine code timed above: not timed again)" if r.extra.get("same_code_as") else ""
    return f"{p.phase}/{p.dtype} {r.median_s * 1e3:.3f} ms{extra}{same}"


# A run within this long of the last one on the same machine reuses its measured
# bandwidth and compute peaks (a re-run is then seconds, not a probe): only the "% of
# bandwidth" fallback reads them; races and the gate measure bandwidth in their own rounds.
PROBE_REUSE_S = 3600


def _probe_host(cfg, say) -> dict:
    from tuner.host import probe

    say("probing the host (caches, NUMA, huge pages, compilers"
        + (", memory bandwidth)" if cfg.measure_bandwidth else ")"))
    if not cfg.measure_bandwidth:
        return probe.probe(measure_bandwidth=False).to_dict()
    ident = probe.probe(measure_bandwidth=False).to_dict()
    kept = Path(cfg.build_dir) / "tuner" / f"probe-{ident['host_id']}.json"
    try:
        old = json.loads(kept.read_text())
        age = time.time() - old["probed_at"]
        if old["fingerprint"] == ident["fingerprint"] and 0 <= age < PROBE_REUSE_S and old.get("bandwidth"):
            say(f"reusing the bandwidth and compute peaks measured {age / 60:.0f} min ago "
                f"({kept.name}; delete it to measure again)")
            return {**ident, **{k: old.get(k) for k in ("bandwidth", "bandwidth_reason",
                                                        "compute", "compute_reason")}}
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none kept, or unreadable: measure
    info = probe.probe(measure_bandwidth=True).to_dict()
    if info.get("bandwidth"):
        kept.parent.mkdir(parents=True, exist_ok=True)
        render.atomic_write(kept, json.dumps({**info, "probed_at": time.time()}, default=str))
    return info
