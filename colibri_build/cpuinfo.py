"""Parse /proc/cpuinfo into the few facts that pick a target profile.

Small on purpose: vendor, family/model/stepping, model name and ISA flags on x86;
implementer/part and Features on Arm; plus the archspec microarchitecture name and
its ancestors. A later issue grows this into the full host probe (caches, NUMA...).
Functions take the text so tests can feed recorded dumps of other machines.
"""
from __future__ import annotations

import functools
import platform
from dataclasses import dataclass, field, replace
from pathlib import Path

# platform.machine() spellings -> the names profiles use.
_ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "AMD64": "x86_64",
                 "aarch64": "aarch64", "arm64": "aarch64", "ARM64": "aarch64"}


def normalize_arch(machine: str) -> str:
    return _ARCH_ALIASES.get(machine, machine)


def host_arch() -> str:
    return normalize_arch(platform.machine())


@dataclass(frozen=True)
class CpuInfo:
    arch: str                       # x86_64 | aarch64 | ...
    vendor: str                     # GenuineIntel, AuthenticAMD; Arm: implementer code, e.g. 0x41
    flags: frozenset[str]           # x86 "flags" / Arm "Features", as /proc/cpuinfo spells them
    family: int | None = None       # x86 only
    model: int | None = None        # x86 only
    stepping: int | None = None     # x86 only
    model_name: str = ""
    implementer: int | None = None  # Arm only ("CPU implementer")
    part: int | None = None         # Arm only ("CPU part")
    archspec_name: str | None = None           # e.g. "icelake"; None if archspec is absent
    archspec_ancestors: tuple[str, ...] = field(default=())


def _int(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value, 0)  # accepts "207" and "0xd0c"
    except ValueError:
        return None


def _first_block(text: str) -> dict[str, str]:
    """Key/value pairs of the first processor block (all cores report the same ISA)."""
    data: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if data:
                break  # blank line after the first block
            continue
        data.setdefault(key.strip(), value.strip())
    return data


# A key only one architecture's kernel writes -> that architecture (for recorded dumps).
_ARCH_BY_KEY = (("CPU implementer", "aarch64"), ("vendor_id", "x86_64"), ("flags", "x86_64"),
                ("isa", "riscv64"), ("cpu", "ppc64le"))


def _guess_arch(data: dict[str, str]) -> str:
    return next((arch for key, arch in _ARCH_BY_KEY if key in data), "unknown")


def parse_cpuinfo(text: str, arch: str | None = None) -> CpuInfo:
    """CpuInfo from a /proc/cpuinfo text; `arch` is guessed from the keys if not given."""
    data = _first_block(text)
    if arch is None:
        arch = _guess_arch(data)
    if arch == "aarch64":
        implementer = _int(data.get("CPU implementer"))
        cpu = CpuInfo(arch=arch, vendor=data.get("CPU implementer", "generic"),
                      flags=frozenset(data.get("Features", "").split()),
                      model_name=data.get("model name", ""),
                      implementer=implementer, part=_int(data.get("CPU part")))
    else:
        cpu = CpuInfo(arch=arch, vendor=data.get("vendor_id", "generic"),
                      flags=frozenset(data.get("flags", "").split()),
                      family=_int(data.get("cpu family")), model=_int(data.get("model")),
                      stepping=_int(data.get("stepping")),
                      model_name=data.get("model name", ""))
    name, ancestors = archspec_target(cpu)
    return _with_archspec(cpu, name, ancestors)


def _with_archspec(cpu: CpuInfo, name: str | None, ancestors: tuple[str, ...]) -> CpuInfo:
    return replace(cpu, archspec_name=name, archspec_ancestors=ancestors)


def archspec_target(cpu: CpuInfo) -> tuple[str | None, tuple[str, ...]]:
    """archspec's microarchitecture for this CPU, as archspec.cpu.host() would pick it.

    archspec only detects the machine it runs on; this repeats its selection for any
    CpuInfo (feature subset + vendor, deepest target wins) so recorded dumps of other
    hosts can be matched too. Returns (None, ()) when archspec is not installed.
    """
    try:
        from archspec.cpu import TARGETS
        from archspec.cpu.schema import TARGETS_JSON
    except ImportError:
        return None, ()
    if cpu.arch not in TARGETS:
        return None, ()
    vendor = cpu.vendor
    if cpu.arch == "aarch64":
        vendor = TARGETS_JSON["conversions"]["arm_vendors"].get(cpu.vendor, cpu.vendor)
    features = set(cpu.flags)
    if "ssse3" in features:
        features.add("sse3")  # as archspec does: Linux lists SSE3 as "pni"
    part = f"0x{cpu.part:03x}" if cpu.part is not None else ""
    root = TARGETS[cpu.arch]

    def compatible(t) -> bool:
        if t.family != root or t.vendor not in (vendor, "generic"):
            return False
        if cpu.arch == "aarch64" and t.vendor == "generic" and t.name != "aarch64":
            return False  # archspec does not detect armv8.x levels from flags
        return t.features.issubset(features)

    candidates = [t for t in TARGETS.values() if compatible(t)] or [root]
    key = lambda t: (len(t.ancestors), len(t.features))  # noqa: E731 - archspec's order
    best_generic = max((t for t in candidates if t.vendor == "generic"), key=key, default=root)
    if part and any(getattr(t, "cpu_part", "") == part for t in candidates):
        candidates = [t for t in candidates if getattr(t, "cpu_part", "") == part]
    specific = [t for t in candidates if t > best_generic]
    best = max(specific, key=key) if specific else best_generic
    return best.name, tuple(a.name for a in best.ancestors)


@functools.lru_cache(maxsize=None)
def host_cpu() -> CpuInfo:
    """This host's CpuInfo (cached). Off Linux, flags come from archspec's own probe."""
    path = Path("/proc/cpuinfo")
    if path.exists():
        cpu = parse_cpuinfo(path.read_text(errors="replace"), arch=host_arch())
        try:  # the real host: trust archspec's own detection (it also reads cpuid on some OSes)
            import archspec.cpu
            h = archspec.cpu.host()
            return _with_archspec(cpu, h.name, tuple(a.name for a in h.ancestors))
        except ImportError:
            return cpu
    try:
        import archspec.cpu
        h = archspec.cpu.host()
        return CpuInfo(arch=host_arch(), vendor=h.vendor, flags=frozenset(h.features),
                       archspec_name=h.name, archspec_ancestors=tuple(a.name for a in h.ancestors))
    except ImportError:
        return CpuInfo(arch=host_arch(), vendor="generic", flags=frozenset())
