"""Target-profile registry: profiles/*.yaml -> resolved compiler, flags and host fit.

A profile is data (see profiles/README.md for the schema): the target's architecture,
the host ISA features its code needs, the kernel ISAs it can run, default knob values,
and per-compiler flag tables whose entries carry a version range. This module loads
the files, resolves `inherits:`, checks the compiler that is actually installed
(`CC -dumpfullversion`, predefined macros) and picks the first flag entry whose range
holds, recording why a fallback was taken. It also matches a host CPU to the most
specific profile it can run.

Kept free of numpy and of the rest of the tuner: SConstruct and the Python binding
import it on every build / first load.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from . import cpuinfo as _cpuinfo, isas as _isas
from .paths import PROFILES_DIR

ARCHES = ("any", "x86_64", "aarch64")   # "any": the build host's own architecture
KINDS = ("target", "build")             # build kinds (debug, asan) are never auto-selected
COMPILER_FAMILIES = ("gcc", "clang")

# Flags every build uses, before the profile's: later flags win (debug's -O0 beats -O3).
# No FMA contraction (GCC's default in -std=c11, not clang's): the scalar and vector
# epilogues (epilogue.j2) must give the same bits from the same operations.
BASE_CFLAGS = ("-O3", "-fPIC", "-fopenmp", "-std=c11", "-ffp-contract=off", "-Wall", "-Wextra")
BASE_LDFLAGS = ("-fopenmp",)

# Debian/Ubuntu package of a native compiler executable, for "not installed" messages.
# Cross compilers name their package in the profile's `cross:` table.
PACKAGE_HINTS = {"gcc": "gcc", "cc": "gcc", "clang": "clang"}


class ProfileError(ValueError):
    """A profile file is malformed, or a profile name is unknown."""


class UnknownProfile(ProfileError):
    def __init__(self, name: str, valid: Iterable[str]):
        self.name, self.valid = name, sorted(valid)
        super().__init__(f"unknown profile '{name}'. Valid profiles: {', '.join(self.valid)}")


class ResolveError(ProfileError):
    """The profile cannot be built here: compiler missing, too old, or the wrong target."""


# ---------------------------------------------------------------- data classes

@dataclass(frozen=True)
class FlagRule:
    versions: str                 # version range, e.g. ">=12.3" or ">=10.3,<12.3"; "" = any
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...] = ()
    note: str = ""                # why this entry (a fallback) is needed; shown and recorded


@dataclass(frozen=True)
class CrossCompiler:
    cc: str                       # executable, e.g. aarch64-linux-gnu-gcc
    package: str                  # where to get it, e.g. gcc-aarch64-linux-gnu
    cflags: tuple[str, ...] = ()  # e.g. clang's --target=aarch64-linux-gnu


@dataclass(frozen=True)
class CpuIdMatch:
    """One CPU identity: x86 vendor/family/models, or Arm implementer/parts (inclusive ranges)."""
    vendor: str | None = None
    family: int | None = None
    models: tuple[tuple[int, int], ...] = ()
    implementer: int | None = None
    parts: tuple[tuple[int, int], ...] = ()

    def matches(self, cpu: _cpuinfo.CpuInfo) -> bool:
        if self.implementer is not None:
            return cpu.implementer == self.implementer and _in_ranges(cpu.part, self.parts)
        return (cpu.vendor == self.vendor and cpu.family == self.family
                and _in_ranges(cpu.model, self.models))


@dataclass(frozen=True)
class HostMatch:
    archspec: tuple[str, ...] = ()       # archspec microarchitecture names this profile is for
    cpuid: tuple[CpuIdMatch, ...] = ()   # CPU identities (VMs hide flags archspec relies on)
    fallback: bool = False               # a generic level: chosen when nothing specific matches


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    kind: str                            # target | build
    inherits: str | None
    chain: tuple[str, ...]               # this profile, then its ancestors
    arch: str                            # any | x86_64 | aarch64
    features: frozenset[str]             # host ISA features the code needs (/proc/cpuinfo names)
    kernel_isas: tuple[str, ...]         # ISAs its kernels may use, preferred first
    knobs: dict[str, Any]                # default knob values (merged along inheritance)
    flags: dict[str, tuple[FlagRule, ...]]        # compiler family -> rules, first match wins
    cross: dict[str, CrossCompiler]      # compiler family -> cross compiler (other-arch hosts)
    match: HostMatch
    space: dict[str, dict[str, list]]    # template -> knob -> allowed values (search-space cut)
    notes: tuple[str, ...]
    path: str
    # shape class -> knob values its layers run besides `knobs` (colibri_build/shapes.py),
    # promoted from the fleet's tuned artifacts (`tuner promote`); this profile's own
    shapes: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Compiler:
    exe: str            # as requested (name or path)
    path: str           # absolute path of the executable
    family: str         # gcc | clang
    version: str        # e.g. 12.2.0
    target_arch: str    # architecture it generates code for


@dataclass(frozen=True)
class Resolved:
    profile: str
    kind: str
    arch: str                     # concrete architecture ("any" resolved to the host's)
    compiler: Compiler
    cflags: tuple[str, ...]       # complete: base flags, cross flags, the chosen rule's flags
    ldflags: tuple[str, ...]
    rule: FlagRule
    notes: tuple[str, ...]
    features: tuple[str, ...]
    kernel_isas: tuple[str, ...]
    knobs: dict[str, Any]
    cross: bool                   # the compiler targets another architecture than the host
    runnable_here: bool
    reason: str                   # why the code can / cannot run on this host

    @property
    def compiler_path(self) -> str:
        return self.compiler.path

    @property
    def version(self) -> str:
        return self.compiler.version


# ---------------------------------------------------------------- version ranges

_CLAUSE = re.compile(r"^(>=|<=|==|!=|>|<)?\s*(\d+(?:\.\d+)*)$")
_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        "<": lambda a, b: a < b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def parse_version(text: str) -> tuple[int, ...]:
    """'12.2.0' -> (12, 2, 0); trailing non-numeric parts ('12.2.0-14') are ignored."""
    m = re.match(r"\s*(\d+(?:\.\d+)*)", str(text))
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def _pad(a: tuple[int, ...], n: int) -> tuple[int, ...]:
    return a + (0,) * (n - len(a))


def check_range(spec: str) -> None:
    """Raise ValueError if `spec` is not a valid version range."""
    for clause in filter(None, (c.strip() for c in str(spec).split(","))):
        if clause not in ("*", "any") and not _CLAUSE.match(clause):
            raise ValueError(f"bad version range clause {clause!r} in {spec!r} "
                             f"(use e.g. '>=13' or '>=10.3,<12.3')")


def version_in_range(version: str | tuple[int, ...], spec: str) -> bool:
    """Whether `version` satisfies every comma-separated clause of `spec`.

    Clauses: '>=13', '<12.3', '==12.2', '!=11'; a bare '12' means the 12.x series.
    Missing components count as 0 ('<13' excludes 13.0.0). '', 'any' and '*' match all.
    """
    v = parse_version(version) if isinstance(version, str) else tuple(version)
    for clause in filter(None, (c.strip() for c in str(spec).split(","))):
        if clause in ("*", "any"):
            continue
        m = _CLAUSE.match(clause)
        if not m:
            raise ValueError(f"bad version range clause {clause!r} in {spec!r}")
        op, bound = m.group(1), tuple(int(p) for p in m.group(2).split("."))
        if op is None:  # series: the leading components must be equal
            if _pad(v, len(bound))[:len(bound)] != bound:
                return False
            continue
        n = max(len(v), len(bound))
        if not _OPS[op](_pad(v, n), _pad(bound, n)):
            return False
    return True


# ---------------------------------------------------------------- loading

# How a child's key combines with its parent's. Absent from this table: the child's
# value replaces the parent's ("replace"). "own": never inherited (a CPU identity
# belongs to one profile only).
_MERGE = {"features": "union", "knobs": "merge", "flags": "merge", "cross": "merge",
          "space": "merge", "match": "own", "name": "own", "description": "own",
          "inherits": "own", "shapes": "own"}

# Allowed keys and their YAML types; anything else is a typo and is refused.
_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "name": str, "description": str, "kind": str, "inherits": str, "arch": str,
    "features": list, "kernel_isas": list, "knobs": dict, "flags": dict, "cross": dict,
    "match": dict, "space": dict, "notes": list, "shapes": dict,
}
_DEFAULTS: dict[str, Any] = {
    "kind": "target", "arch": "any", "features": [], "kernel_isas": ["portable", "scalar"],
    "knobs": {}, "flags": {}, "cross": {}, "match": {}, "space": {}, "notes": [],
    "description": "", "shapes": {},
}


def _in_ranges(value: int | None, ranges: tuple[tuple[int, int], ...]) -> bool:
    return value is not None and any(lo <= value <= hi for lo, hi in ranges)


def _ranges(items: Any, where: str) -> tuple[tuple[int, int], ...]:
    """[143, 207, "0x10-0x1f"] -> ((143, 143), (207, 207), (16, 31))."""
    out = []
    for item in items if isinstance(items, list) else [items]:
        if isinstance(item, int):
            out.append((item, item))
        elif isinstance(item, str) and "-" in item:
            lo, hi = (int(x, 0) for x in item.split("-", 1))
            out.append((lo, hi))
        elif isinstance(item, str):
            out.append((int(item, 0),) * 2)
        else:
            raise ProfileError(f"{where}: bad model/part {item!r} (int or 'lo-hi')")
    return tuple(out)


def _read_raw(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile is a YAML mapping")
    for key, value in data.items():
        if key not in _SCHEMA:
            raise ProfileError(f"{path}: unknown key '{key}' (allowed: {', '.join(_SCHEMA)})")
        if value is not None and not isinstance(value, _SCHEMA[key]):
            raise ProfileError(f"{path}: '{key}' must be a {_SCHEMA[key].__name__}")
    if data.get("name") != path.stem:
        raise ProfileError(f"{path}: name '{data.get('name')}' must equal the file name '{path.stem}'")
    return data


def _merge(parent: dict, child: dict) -> dict:
    out = {k: v for k, v in parent.items() if _MERGE.get(k) != "own"}
    for key, value in child.items():
        rule = _MERGE.get(key, "replace")
        if rule == "union":
            out[key] = sorted(set(out.get(key) or []) | set(value or []))
        elif rule == "merge":
            out[key] = {**(out.get(key) or {}), **(value or {})}
        else:
            out[key] = value
    return out


def _flag_rules(raw: Any, where: str) -> dict[str, tuple[FlagRule, ...]]:
    out = {}
    for family, rules in (raw or {}).items():
        if family not in COMPILER_FAMILIES:
            raise ProfileError(f"{where}: flags for unknown compiler '{family}' "
                               f"(known: {', '.join(COMPILER_FAMILIES)})")
        if rules == []:  # `gcc: []`: this profile does not build with that family (its parent's rules dropped)
            continue
        parsed = []
        for i, r in enumerate(rules or []):
            if not isinstance(r, dict) or set(r) - {"versions", "cflags", "ldflags", "note"}:
                raise ProfileError(f"{where}: flags.{family}[{i}] must be a mapping of "
                                   f"versions/cflags/ldflags/note")
            try:
                check_range(r.get("versions", ""))
            except ValueError as exc:
                raise ProfileError(f"{where}: flags.{family}[{i}]: {exc}") from None
            parsed.append(FlagRule(versions=str(r.get("versions", "") or ""),
                                   cflags=tuple(r.get("cflags") or ()),
                                   ldflags=tuple(r.get("ldflags") or ()),
                                   note=str(r.get("note", "") or "").strip()))
        out[family] = tuple(parsed)
    return out


def _cross(raw: Any, where: str) -> dict[str, CrossCompiler]:
    out = {}
    for family, entry in (raw or {}).items():
        if family not in COMPILER_FAMILIES or not isinstance(entry, dict) or "cc" not in entry:
            raise ProfileError(f"{where}: cross.{family} must be {{cc, package, cflags?}} "
                               f"for a compiler family in {COMPILER_FAMILIES}")
        out[family] = CrossCompiler(cc=entry["cc"], package=entry.get("package", entry["cc"]),
                                    cflags=tuple(entry.get("cflags") or ()))
    return out


def _host_match(raw: Any, where: str) -> HostMatch:
    raw = raw or {}
    if set(raw) - {"archspec", "cpuid", "fallback"}:
        raise ProfileError(f"{where}: match takes archspec, cpuid, fallback")
    ids = []
    for entry in raw.get("cpuid") or []:
        if "implementer" in entry:
            ids.append(CpuIdMatch(implementer=int(entry["implementer"]),
                                  parts=_ranges(entry.get("parts", []), where)))
        else:
            ids.append(CpuIdMatch(vendor=entry["vendor"], family=int(entry["family"]),
                                  models=_ranges(entry.get("models", []), where)))
    return HostMatch(archspec=tuple(raw.get("archspec") or ()), cpuid=tuple(ids),
                     fallback=bool(raw.get("fallback", False)))


def _build(name: str, merged: dict, chain: tuple[str, ...], path: Path) -> Profile:
    d = {**_DEFAULTS, **{k: v for k, v in merged.items() if v is not None}}
    where = str(path)
    if d["arch"] not in ARCHES:
        raise ProfileError(f"{where}: arch '{d['arch']}' is not one of {', '.join(ARCHES)}")
    if d["kind"] not in KINDS:
        raise ProfileError(f"{where}: kind '{d['kind']}' is not one of {', '.join(KINDS)}")
    features = frozenset(d["features"])
    # a profile may list an ISA in kernel_isas only if its `features` include the record's
    # (templates/isas.yaml): the avx512 kernels may assume everything x86-64-v4 guarantees
    known = _isas.records()
    for isa in d["kernel_isas"]:
        if isa not in known:
            raise ProfileError(f"{where}: kernel isa '{isa}' unknown (known: {', '.join(known)})")
        rec = known[isa]
        if rec.arch is not None and d["arch"] != rec.arch:
            raise ProfileError(f"{where}: kernel isa '{isa}' needs arch {rec.arch}, profile is {d['arch']}")
        missing = set(rec.features) - features
        if missing:
            raise ProfileError(f"{where}: kernel isa '{isa}' needs features {sorted(missing)} "
                               f"that the profile does not require")
    return Profile(
        name=name, description=str(d["description"]).strip(), kind=d["kind"],
        inherits=merged.get("inherits"), chain=chain, arch=d["arch"], features=features,
        kernel_isas=tuple(d["kernel_isas"]), knobs=dict(d["knobs"]),
        flags=_flag_rules(d["flags"], where), cross=_cross(d["cross"], where),
        match=_host_match(d["match"], where), space={k: dict(v) for k, v in d["space"].items()},
        notes=tuple(str(n).strip() for n in d["notes"]), path=where,
        shapes=_shape_knobs(d["shapes"], where))


def _shape_knobs(raw: dict, where: str) -> dict[str, dict[str, Any]]:
    from . import shapes

    out = {}
    for name, knobs in (raw or {}).items():
        try:
            shapes.parse(name)
        except ValueError as exc:
            raise ProfileError(f"{where}: shapes: {exc}") from None
        if not isinstance(knobs, dict) or not knobs:
            raise ProfileError(f"{where}: shapes.{name} must map knob names to values")
        out[str(name)] = dict(knobs)
    return out


def load_registry(dir: str | os.PathLike = PROFILES_DIR) -> dict[str, Profile]:  # noqa: A002
    """All profiles of `dir`, inheritance resolved, validated. Raises ProfileError."""
    directory = Path(dir)
    raws = {p.stem: (p, _read_raw(p)) for p in sorted(directory.glob("*.yaml"))}
    if not raws:
        raise ProfileError(f"no profiles (*.yaml) in {directory}")
    merged: dict[str, tuple[dict, tuple[str, ...]]] = {}

    def resolve_one(name: str, stack: tuple[str, ...]) -> tuple[dict, tuple[str, ...]]:
        if name in merged:
            return merged[name]
        if name in stack:
            raise ProfileError(f"inheritance cycle: {' -> '.join(stack + (name,))}")
        path, raw = raws[name]
        parent = raw.get("inherits")
        if parent is None:
            result = (dict(raw), (name,))
        else:
            if parent not in raws:
                raise ProfileError(f"{path}: inherits unknown profile '{parent}'")
            pdata, pchain = resolve_one(parent, stack + (name,))
            result = (_merge(pdata, raw), (name,) + pchain)
        merged[name] = result
        return result

    return {name: _build(name, *resolve_one(name, ()), raws[name][0]) for name in raws}


@functools.lru_cache(maxsize=None)
def _default_registry() -> dict[str, Profile]:
    return load_registry(PROFILES_DIR)


def registry(dir: str | os.PathLike | None = None) -> dict[str, Profile]:  # noqa: A002
    """The registry of `dir` (the repository's profiles/ by default, cached)."""
    return _default_registry() if dir is None else load_registry(dir)


def get_profile(name: str, reg: Mapping[str, Profile] | None = None) -> Profile:
    reg = registry() if reg is None else reg
    if name not in reg:
        raise UnknownProfile(name, reg)
    return reg[name]


# ---------------------------------------------------------------- compilers

class CompilerMissing(ResolveError):
    pass


def probe_compiler(exe: str, extra_flags: tuple[str, ...] = ()) -> Compiler:
    """Family, version and target of a C compiler, from the compiler itself.

    Family and target come from its predefined macros (robust across gcc and clang);
    a gcc version from `-dumpfullversion` (plain -dumpversion can print only '12').
    """
    path = shutil.which(exe)
    if path is None:
        raise CompilerMissing(f"C compiler '{exe}' not found on PATH")
    return _probe(exe, os.path.realpath(path), path, tuple(extra_flags))


@functools.lru_cache(maxsize=None)
def _probe(exe: str, realpath: str, path: str, extra_flags: tuple[str, ...]) -> Compiler:
    """Cached per resolved executable: a PATH change is a different compiler."""
    try:
        res = subprocess.run([path, *extra_flags, "-dM", "-E", "-x", "c", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ResolveError(f"could not run C compiler '{path}': {exc}") from None
    if res.returncode != 0:
        raise ResolveError(f"C compiler '{path}' failed to preprocess an empty file:\n{res.stderr.strip()}")
    macros = dict(line.split(" ", 2)[1:3] for line in res.stdout.splitlines()
                  if line.startswith("#define ") and line.count(" ") >= 2)
    if "__clang__" in macros:
        family = "clang"
        version = ".".join(macros.get(k, "0") for k in
                           ("__clang_major__", "__clang_minor__", "__clang_patchlevel__"))
    elif "__GNUC__" in macros:
        family = "gcc"
        full = subprocess.run([path, "-dumpfullversion"], capture_output=True, text=True)
        version = full.stdout.strip() if full.returncode == 0 and full.stdout.strip() else ".".join(
            macros.get(k, "0") for k in ("__GNUC__", "__GNUC_MINOR__", "__GNUC_PATCHLEVEL__"))
    else:
        raise ResolveError(f"'{path}' is neither gcc nor clang (no __GNUC__/__clang__ macro)")
    target = ("x86_64" if "__x86_64__" in macros else "aarch64" if "__aarch64__" in macros
              else "unknown")
    return Compiler(exe=exe, path=path, family=family, version=version, target_arch=target)


def select_flags(profile: Profile, family: str, version: str) -> FlagRule:
    """First rule of profile.flags[family] whose version range holds `version`."""
    rules = profile.flags.get(family)
    if not rules:
        have = ", ".join(profile.flags) or "none"
        raise ResolveError(f"profile '{profile.name}' has no flag table for {family} (has: {have})")
    for rule in rules:
        if version_in_range(version, rule.versions):
            return rule
    ranges = "; ".join(r.versions or "any" for r in rules)
    raise ResolveError(f"{family} {version} is not supported by profile '{profile.name}' "
                       f"(its flag table covers: {ranges}); use a newer compiler via cc=")


def _pick_compiler(profile: Profile, arch: str, host_arch: str, cc: str) -> tuple[str, tuple[str, ...], str, str]:
    """(executable, extra cflags, package hint, why it is needed)."""
    if arch != host_arch and cc in COMPILER_FAMILIES:
        entry = profile.cross.get(cc)
        if entry is None:
            raise ResolveError(
                f"profile '{profile.name}' targets {arch} but this host is {host_arch}, and the "
                f"profile declares no {cc} cross compiler (cross: in {profile.path}); "
                f"pass cc=<a {arch} compiler>")
        return entry.cc, entry.cflags, entry.package, f"the {cc} cross compiler for {arch}"
    package = PACKAGE_HINTS.get(os.path.basename(cc), "a package that provides it")
    return cc, (), package, f"cc={cc}"


def resolve(profile: Profile | str, cc: str = "gcc",
            host: _cpuinfo.CpuInfo | None = None) -> Resolved:
    """Compiler, complete flags, notes and host fit of `profile` built with `cc`.

    `cc` is a compiler family ('gcc', 'clang': for a cross target the profile's cross
    compiler of that family is used) or an executable name/path. Raises ResolveError
    with a message saying what is missing and how to get it.
    """
    prof = get_profile(profile) if isinstance(profile, str) else profile
    host = _cpuinfo.host_cpu() if host is None else host
    arch = host.arch if prof.arch == "any" else prof.arch
    exe, extra, package, why = _pick_compiler(prof, arch, host.arch, cc)
    try:
        comp = probe_compiler(exe, tuple(extra))
    except CompilerMissing:
        raise CompilerMissing(
            f"profile '{prof.name}' needs {why}: '{exe}', which is not installed (not on PATH). "
            f"Install it (Debian/Ubuntu: apt-get install {package}) or pass cc=<compiler path>."
        ) from None
    if comp.target_arch != arch:
        raise ResolveError(f"compiler '{exe}' ({comp.family} {comp.version}) generates "
                           f"{comp.target_arch} code but profile '{prof.name}' targets {arch}; "
                           f"pass cc=<a compiler for {arch}>")
    rule = select_flags(prof, comp.family, comp.version)
    notes = list(prof.notes)
    if rule.note:
        notes.append(f"{rule.note} (found {comp.family} {comp.version})")
    cross = arch != host.arch
    if cross:
        notes.append(f"cross-compiling for {arch} with {comp.path}")
    runnable, reason = runs_on(prof, host)
    return Resolved(
        profile=prof.name, kind=prof.kind, arch=arch, compiler=comp,
        cflags=BASE_CFLAGS + tuple(extra) + rule.cflags,
        ldflags=BASE_LDFLAGS + tuple(extra) + rule.ldflags, rule=rule, notes=tuple(notes),
        features=tuple(sorted(prof.features)), kernel_isas=prof.kernel_isas,
        knobs=dict(prof.knobs), cross=cross, runnable_here=runnable, reason=reason)


# ---------------------------------------------------------------- host fit

def missing_features(profile: Profile, host: _cpuinfo.CpuInfo) -> list[str]:
    return sorted(profile.features - host.flags)


def runs_on(profile: Profile, host: _cpuinfo.CpuInfo) -> tuple[bool, str]:
    """Whether code built for `profile` can run on `host`, and why (not)."""
    if profile.arch not in ("any", host.arch):
        return False, f"built for {profile.arch}; this host is {host.arch}"
    missing = missing_features(profile, host)
    if missing:
        return False, f"this host lacks {', '.join(missing)}"
    return True, "this host has every required feature"


def _identity(cpu: _cpuinfo.CpuInfo) -> str:
    if cpu.implementer is not None:
        part = f"0x{cpu.part:03x}" if cpu.part is not None else "?"
        return f"implementer 0x{cpu.implementer:02x} part {part}"
    return f"{cpu.vendor} family {cpu.family} model {cpu.model}"


def match_host(host_cpu: _cpuinfo.CpuInfo,
               reg: Mapping[str, Profile] | None = None) -> tuple[str, dict[str, str]]:
    """The most specific target profile `host_cpu` can run, and a reason per profile.

    Order: (1) a profile listing the CPU's identity (vendor/family/model or Arm
    implementer/part): exact, and immune to flags a hypervisor hides; (2) a profile
    listing archspec's name for the CPU, then each archspec ancestor in turn, and from it
    the most derived profile whose features the host all has; (3) the
    fallback level (generic, x86-64-vN, armv8-a) with the most required features.
    A candidate is taken only if the host has every feature it requires.
    """
    reg = registry() if reg is None else reg
    reasons: dict[str, str] = {}
    runnable: dict[str, bool] = {}
    for name, prof in reg.items():
        ok, why = runs_on(prof, host_cpu)
        runnable[name] = ok and prof.kind == "target"
        reasons[name] = (f"build kind, never chosen automatically" if prof.kind != "target"
                         else f"runnable ({why})" if ok else f"not runnable: {why}")
    targets = [p for p in reg.values() if p.kind == "target"]

    best, how = None, ""
    for prof in targets:
        if any(m.matches(host_cpu) for m in prof.match.cpuid):
            if runnable[prof.name]:
                best, how = prof.name, f"CPU identity ({_identity(host_cpu)}) is listed by this profile"
                break
            reasons[prof.name] = (f"CPU identity ({_identity(host_cpu)}) matches but "
                                  f"{reasons[prof.name]}")
    if best is None and host_cpu.archspec_name:
        for uarch in (host_cpu.archspec_name,) + host_cpu.archspec_ancestors:
            hits = [p.name for p in targets if uarch in p.match.archspec and runnable[p.name]]
            if hits:
                best = hits[0]
                how = (f"archspec detects {host_cpu.archspec_name}" +
                       ("" if uarch == host_cpu.archspec_name else f", whose ancestor {uarch}") +
                       " is listed by this profile")
                break
        if best is not None and not reg[best].match.fallback:
            # A hypervisor that hides one flag archspec needs (WAITPKG) and reports a CPU
            # identity no profile lists makes archspec name an ancestor core. Where the host
            # has every feature of a profile derived from that one, the derived one is the
            # truer name (from a generic level no such inference is safe: siblings differ).
            below = [p for p in targets if best in p.chain[1:] and runnable[p.name]]
            if below:
                deeper = max(below, key=lambda p: (len(p.chain), len(p.features))).name
                how = (f"archspec detects {host_cpu.archspec_name}, listed by {best}; this "
                       f"host has every feature of {deeper}, which derives from it")
                best = deeper
    if best is None:
        levels = [p for p in targets if p.match.fallback and runnable[p.name]]
        if levels:
            best = max(levels, key=lambda p: (len(p.features), p.arch != "any")).name
            how = "no specific profile matched; the most capable generic level this host runs"
    if best is None:
        best, how = "generic", "nothing else is runnable here"
    reasons[best] = f"selected: {how}"
    chosen = reg.get(best)
    for prof in targets:
        if prof.name != best and runnable[prof.name]:
            reasons[prof.name] = _why_not_selected(prof, host_cpu, chosen)
    return best, reasons


def _why_not_selected(prof: Profile, cpu: _cpuinfo.CpuInfo, chosen: Profile | None) -> str:
    """Why a profile the host can run lost to `chosen` (for `python -m tuner profiles`)."""
    best = chosen.name if chosen is not None else "generic"
    uarchs = ((cpu.archspec_name,) + cpu.archspec_ancestors) if cpu.archspec_name else ()
    if any(m.matches(cpu) for m in prof.match.cpuid):
        return f"runnable, not selected: lists this CPU identity too, but {best} comes first"
    listed = [u for u in uarchs if u in prof.match.archspec]
    if listed:
        return (f"runnable, not selected: lists archspec {listed[0]} (this CPU or an ancestor), "
                f"but {best} is more specific")
    if prof.match.fallback:
        if chosen is not None and chosen.match.fallback:
            return f"runnable, not selected: a generic level with fewer features than {best}"
        return f"runnable, not selected: a generic level; {best} is more specific"
    wants = list(prof.match.archspec) + [_match_text(m) for m in prof.match.cpuid]
    seen = f"archspec {cpu.archspec_name}, " if cpu.archspec_name else ""
    return (f"runnable, not selected: made for another CPU ({'; '.join(wants) or 'none listed'}); "
            f"this one is {seen}{_identity(cpu)}")


def _match_text(m: CpuIdMatch) -> str:
    def ranges(rs, fmt):
        return ",".join(fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}" for lo, hi in rs)
    if m.implementer is not None:
        return f"implementer 0x{m.implementer:02x} part {ranges(m.parts, lambda v: f'0x{v:03x}')}"
    return f"{m.vendor} family {m.family} model {ranges(m.models, lambda v: f'0x{v:02x}')}"


# ---------------------------------------------------------------- report (CLI)

def _rule_dict(rule: FlagRule) -> dict:
    return {"versions": rule.versions or "any", "cflags": list(rule.cflags),
            "ldflags": list(rule.ldflags), "note": rule.note}


def report(names: Iterable[str] | None = None, cc: str = "gcc",
           host: _cpuinfo.CpuInfo | None = None,
           reg: Mapping[str, Profile] | None = None) -> dict:
    """The registry as this host sees it: per profile its inheritance, the flags it
    resolves to with compiler `cc` (or why it cannot be built), whether the host can
    run it, and why it was or was not matched. JSON-ready; `python -m tuner profiles`
    prints it (format_report) and `--json` dumps it."""
    reg = registry() if reg is None else reg
    host = _cpuinfo.host_cpu() if host is None else host
    best, reasons = match_host(host, reg)
    rows = []
    for name in (list(names) if names else sorted(reg)):
        prof = get_profile(name, reg)
        row: dict[str, Any] = {
            "profile": name, "kind": prof.kind, "description": prof.description,
            "inherits": prof.inherits, "chain": list(prof.chain), "arch": prof.arch,
            "features": sorted(prof.features), "kernel_isas": list(prof.kernel_isas),
            "knobs": dict(prof.knobs),
            "match": {"archspec": list(prof.match.archspec),
                      "cpuid": [_match_text(m) for m in prof.match.cpuid],
                      "fallback": prof.match.fallback},
            "selected": name == best, "host_match": reasons.get(name, ""),
        }
        try:
            r = resolve(prof, cc, host)
            row.update(ok=True, compiler={"family": r.compiler.family, "version": r.version,
                                          "path": r.compiler.path},
                       cflags=list(r.cflags[len(BASE_CFLAGS):]),
                       ldflags=list(r.ldflags[len(BASE_LDFLAGS):]),
                       rule=_rule_dict(r.rule), fallback=bool(r.rule.note),
                       notes=list(r.notes), cross=r.cross,
                       runnable_here=r.runnable_here, reason=r.reason)
        except ProfileError as exc:
            runnable, why = runs_on(prof, host)
            family = cc if cc in COMPILER_FAMILIES else None
            row.update(ok=False, error=str(exc), runnable_here=runnable, reason=why,
                       rules=[_rule_dict(x) for x in prof.flags.get(family or "gcc", ())])
        rows.append(row)
    return {"host": {"arch": host.arch, "identity": _identity(host),
                     "archspec": host.archspec_name, "model_name": host.model_name},
            "cc": cc, "host_profile": best, "host_profile_reason": reasons[best],
            "base_cflags": list(BASE_CFLAGS), "base_ldflags": list(BASE_LDFLAGS),
            "profiles": rows}


def format_report(rep: dict) -> str:
    """Human-readable form of report()."""
    host = rep["host"]
    out = [f"host: {host['model_name'] or host['identity']} [{host['identity']}; "
           f"archspec {host['archspec']}]",
           f"host profile: {rep['host_profile']} ({rep['host_profile_reason']})",
           f"base flags (every build): {' '.join(rep['base_cflags'])}"]
    for row in rep["profiles"]:
        mark = "*" if row["selected"] else " "
        parent = f" <- {' <- '.join(row['chain'][1:])}" if row["inherits"] else ""
        out.append(f"\n{mark} {row['profile']} [{row['kind']}, {row['arch']}]{parent}")
        out.append(f"    {row['description']}")
        if row["ok"]:
            flags = " ".join(row["cflags"] + [f for f in row["ldflags"] if f not in row["cflags"]])
            c = row["compiler"]
            out.append(f"    {c['family']} {c['version']} (versions {row['rule']['versions']}): "
                       f"{flags or '(no extra flags)'}")
            for note in row["notes"]:
                out.append(f"    note: {note}")
        else:
            out.append(f"    cannot build here: {row['error']}")
            if row.get("rules"):
                r = row["rules"][0]
                out.append(f"    flags when built (versions {r['versions']}): "
                           f"{' '.join(r['cflags']) or '(none)'}")
        out.append(f"    kernels {', '.join(row['kernel_isas'])}; "
                   f"{'runs' if row['runnable_here'] else 'does NOT run'} here: {row['reason']}")
        out.append(f"    match: {row['host_match']}")
    return "\n".join(out)


def _main(argv: list[str]) -> int:
    """python -m colibri_build.profiles [--cc gcc] [--json] [NAME...]: same as `python -m tuner profiles`."""
    import argparse
    import json
    ap = argparse.ArgumentParser(prog="python -m colibri_build.profiles", description=_main.__doc__)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--cc", default="gcc")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        rep = report(args.names or None, args.cc)
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rep, indent=2) if args.json else format_report(rep))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
