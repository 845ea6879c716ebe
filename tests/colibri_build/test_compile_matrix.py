"""Every kernel ISA x the extremes of every knob class compiles with -Werror under the
flags of a profile that runs that ISA. The points come from the knobs file, so a new
knob or class is covered without editing this test; a new ISA's record names the profiles
it is compiled under (compile_under). Behaviour is checked elsewhere (the kernel-variant
corners, the layer tests); this checks that no corner of the space breaks the build."""
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from colibri_build import cpuinfo, isas, parts, paths, profiles, render

KERNEL = "expert_ffn"
# kernel isa -> the profiles it is compiled under (its record's compile_under, in
# templates/isas.yaml): each distinct set of the capabilities the template tests for
# (VNNI on avx2 and avx512, AMX; SDOT, BF16, I8MM on neon), so every #if branch compiles
PROFILES = {name: list(rec.compile_under) for name, rec in isas.records().items()}


def _valid(spec, point) -> bool:
    try:
        render.validate_knobs(spec, point)
        return True
    except render.KnobError:
        return False


def _extremes(spec, defaults, names, pick) -> list[dict]:
    """Points that together put every knob of `names` at its pick (min or max) value:
    each starts from the defaults (or, where the constraints need it, the class's other
    knobs at their opposite extreme) with one knob not yet covered at its extreme, then
    takes every other knob's extreme that keeps the constraints."""
    other = max if pick is min else min
    out, todo = [], list(names)
    while todo:
        point = dict(defaults, **{todo[0]: pick(spec.knobs[todo[0]].values)})
        if not _valid(spec, point):
            point = {**defaults, **{n: other(spec.knobs[n].values) for n in names},
                     todo[0]: pick(spec.knobs[todo[0]].values)}
        if not _valid(spec, point):
            todo.pop(0)  # no point of this class holds this extreme
            continue
        for n in names:
            trial = dict(point, **{n: pick(spec.knobs[n].values)})
            if _valid(spec, trial):
                point = trial
        todo = [n for n in todo if point[n] != pick(spec.knobs[n].values)]
        out.append(point)
    return out


def points(spec) -> list[tuple[str, dict]]:
    """(name, knobs): the defaults, then points putting every knob at its min and at its
    max value. Classes are independent, so their extreme points are laid over each other
    (the i-th min point of every class in one point) unless that breaks a constraint."""
    defaults = {n: k.default for n, k in spec.knobs.items()}
    out = [("defaults", defaults)]
    for label, pick in (("min", min), ("max", max)):
        per_class = []
        for names in spec.classes().values():
            names = [n for n in names if all(isinstance(v, (int, float)) for v in spec.knobs[n].values)]
            per_class.append(_extremes(spec, defaults, names, pick) if names else [])
        for i in range(max(map(len, per_class))):
            layers = [ps[i] for ps in per_class if i < len(ps)]
            combined = dict(defaults)
            for p in layers:
                combined.update({k: v for k, v in p.items() if v != defaults[k]})
            candidates = [combined] if _valid(spec, combined) else layers
            for p in candidates:
                if p not in [q for _, q in out]:
                    out.append((f"all-{label}{i or ''}", p))
    return out


def matrix():
    spec = render.load_knob_spec(KERNEL)
    cases = []
    for isa in spec.knobs["isa"].values:
        for profile in PROFILES.get(isa, []):
            for name, p in points(spec):
                cases.append((isa, profile, name, dict(p, isa=isa)))
    return cases


def _compile(args):
    cc, source, cflags, out = args
    # -D_GNU_SOURCE: as SConstruct defines it for every object (the AMX path calls syscall())
    return subprocess.run([cc, *cflags, "-D_GNU_SOURCE", "-Werror", "-I", str(paths.KERNELS_DIR),
                           "-c", str(source), "-o", str(out)], capture_output=True, text=True,
                          timeout=600)


def _compiles(tmp_path, cases):
    """Each case's parts rendered and compiled by the profile's gcc (a cross gcc for another
    arch); a part two cases share (the same text) is compiled once."""
    jobs, names, seen = [], [], set()
    for isa, profile, name, knobs in cases:
        resolved = profiles.resolve(profiles.get_profile(profile), "gcc")
        assert resolved.compiler.family == "gcc", (profile, resolved.compiler)
        for part in parts.PARTS:
            p = parts.render_part(KERNEL, knobs, part)
            if (profile, p.symbol) in seen:
                continue
            seen.add((profile, p.symbol))
            src = tmp_path / f"{profile}-{p.symbol}.c"
            src.write_text(p.text)
            jobs.append((resolved.compiler.path, src, list(resolved.cflags), src.with_suffix(".o")))
            names.append(f"{isa}/{profile}/{name}/{part}")
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(_compile, jobs))
    failed = [f"{n}:\n{r.stderr[-1500:]}" for n, r in zip(names, results) if r.returncode != 0]
    assert not failed, f"{len(failed)} of {len(jobs)} failed:\n" + "\n".join(failed[:3])


def _native(profile) -> bool:
    return profiles.get_profile(profile).arch in ("any", cpuinfo.host_cpu().arch)


def test_every_isa_and_class_extreme_compiles_with_werror(tmp_path):
    cases = [c for c in matrix() if _native(c[1])]
    assert len(cases) >= 4 * len(points(render.load_knob_spec(KERNEL)))
    _compiles(tmp_path, cases)


def test_the_other_architecture_isas_cross_compile_with_werror(tmp_path):
    cases = [c for c in matrix() if not _native(c[1])]
    assert cases
    try:
        for profile in {c[1] for c in cases}:
            profiles.resolve(profiles.get_profile(profile), "gcc")
    except profiles.CompilerMissing as e:
        pytest.skip(f"{e} (`scripts/setup --test` installs it)")
    _compiles(tmp_path, cases)


def test_the_points_reach_every_knob_extreme():
    spec = render.load_knob_spec(KERNEL)
    pts = [p for _, p in points(spec)]
    for p in pts:
        render.validate_knobs(spec, p)
    for name, knob in spec.knobs.items():
        if name == "isa" or not all(isinstance(v, (int, float)) for v in knob.values):
            continue
        seen = {p[name] for p in pts}
        assert {min(knob.values), max(knob.values)} <= seen, name


def test_every_isa_has_profiles_that_compile_it():
    spec = render.load_knob_spec(KERNEL)
    for isa in spec.knobs["isa"].values:
        assert PROFILES.get(isa), f"isa {isa!r}: its record in templates/isas.yaml names no compile_under profiles"
        for profile in PROFILES[isa]:
            assert isa in profiles.get_profile(profile).kernel_isas, (isa, profile)


def test_each_capability_is_compiled_under_a_profile_whose_flags_give_it():
    # every #if branch a record's capabilities name is reached by one of its profiles
    from tuner.context import predefined_macros
    for name, rec in isas.records().items():
        native = [p for p in rec.compile_under if _native(p)]
        if not native or not rec.capabilities:
            continue
        given = set()
        for p in native:
            r = profiles.resolve(profiles.get_profile(p), "gcc")
            given |= set(predefined_macros(r.compiler.path, list(r.cflags)) or ())
        for cap, alts in rec.capabilities.items():
            assert any(set(a) <= given for a in alts), (name, cap, rec.compile_under)
