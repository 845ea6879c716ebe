"""Host identity: which profile, and which tuned library, belong to this host.

Light on purpose (no numpy, no building): the Python binding calls it before it opens
a library.

host-id: `<profile>-<hash>`, e.g. `sapphirerapids-3c1f0a9b2d4e`. <profile> is the
profile match_host() picks for this CPU (readable); <hash> is the first 12 hex digits
of SHA-256 over the CPU's identity: architecture, vendor, family, model, model name,
Arm implementer/part, and the sorted ISA flags. Same CPU model and flags -> same id
(across reboots and across identical machines of a fleet); a different model, or a VM
exposing other flags, gets another id, so a tuned library is never picked up by a host
it was not tuned for. The tuned library of a host lives in
<build_dir>/tuned/<host-id>/libcolibri.so (the tuner writes there via tuned_dir()).
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from . import cpuinfo as _cpuinfo
from . import profiles as _profiles


@functools.lru_cache(maxsize=None)
def host_profile_name() -> str:
    """The most specific runnable target profile for this host (see profiles.match_host)."""
    return _profiles.match_host(_cpuinfo.host_cpu())[0]


def host_id(cpu: _cpuinfo.CpuInfo | None = None, profile: str | None = None) -> str:
    """Short stable id of a host's CPU (see the module docstring)."""
    if cpu is None:
        cpu = _cpuinfo.host_cpu()
        profile = profile or host_profile_name()
    elif profile is None:
        profile = _profiles.match_host(cpu)[0]
    identity = [cpu.arch, cpu.vendor, cpu.family, cpu.model, cpu.model_name,
                cpu.implementer, cpu.part, sorted(cpu.flags)]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:12]
    return f"{profile}-{digest}"


def tuned_dir(build_dir: str | Path) -> Path:
    """Where this host's tuned artifacts live (config.h, libcolibri.so, manifest)."""
    return Path(build_dir) / "tuned" / host_id()


def storage_settings_path(build_dir: str | Path) -> Path:
    """Where `python -m tuner storage` keeps this host's read settings for budgeted models
    (apart from tuned_dir(): re-tuning the kernels replaces that directory whole)."""
    return Path(build_dir) / "storage" / f"{host_id()}.json"


def tuned_library_path(build_dir: str | Path) -> Path | None:
    """This host's tuned library if one has been built, else None."""
    path = tuned_dir(build_dir) / "libcolibri.so"
    return path if path.exists() else None


def library_mismatch(lib_path: str | Path) -> str | None:
    """Why a library cannot run on this host, or None when it can (as far as its
    build_info.json tells: none beside the library, as for a hand-built one, is allowed).

    Loading a library built for ISA features this host lacks would die with SIGILL at
    the first vector instruction, far from the cause; the binding refuses it with this
    reason instead.
    """
    info_path = Path(lib_path).with_name("build_info.json")
    if not info_path.exists():
        return None
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError) as exc:
        return (f"{info_path}: unreadable build info ({exc}); cannot tell whether "
                f"{lib_path} runs on this host")
    cpu = _cpuinfo.host_cpu()
    profile = info.get("profile", "?")
    arch = info.get("arch")
    hint = f"build one for this host: scons profile={host_profile_name()}"
    if arch and arch != cpu.arch:
        return (f"{lib_path} was built for {arch} (profile '{profile}'); this host "
                f"is {cpu.arch}; {hint}")
    missing = sorted(set(info.get("features", [])) - cpu.flags)
    if missing:
        return (f"{lib_path} was built for profile '{profile}', which needs CPU "
                f"features this host lacks: {', '.join(missing)}; {hint}")
    return None
