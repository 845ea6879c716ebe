"""HostInfo: everything the tuner needs to know about the machine it tunes for.

    probe(root="/", proc_cpuinfo=None, measure_bandwidth=True, lib=None) -> HostInfo

`root` stands for "/": the real machine, or a recorded tree (tests/fixtures/hosts/
<name>/ holds proc/cpuinfo and a small sys/ tree) so the probe is tested for hosts
we are not on. Only the real machine ("/" with proc_cpuinfo=None) measures memory
bandwidth, runs dmidecode and asks psutil; a recorded tree reports those from its
files or not at all.

Where each field comes from
  vendor ... model_name, isa   /proc/cpuinfo, parsed by colibri_build.cpuinfo
  microarchitecture            archspec (flags) or the CPU identity table of the
                               profiles' match.cpuid entries; see identify()
  cores, threads, caches,      sysfs (tuner.host.sysfs): caches from cpu0/cache/index*/,
  numa, hugepages              never from py-cpuinfo, which guesses
  memory_channels              `dmidecode -t memory` (root only), else null + reason
  memory_total_bytes           psutil (real host) / proc/meminfo (recorded tree)
  compilers                    each of COMPILERS on PATH: path, family, version
  bandwidth                    tuner.host.bandwidth.measure(): read and triad GB/s
  compute                      tuner.host.peak.measure(): GOP/s of the f32 FMA, bf16 and
                               int8 dots and AMX tiles (the roofline's compute half)
  profile, host_id             colibri_build.profiles.match_host / colibri_build.hostid.host_id
  fingerprint                  sha256 of identity(): see there

The JSON form (to_dict, `python -m tuner probe --json`) is a contract: field names
are stable; a new field may be added, none renamed or removed without bumping
SCHEMA_VERSION.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri_build import cpuinfo as _cpuinfo
from colibri_build import hostid as _hostid
from colibri_build import profiles as _profiles
from tuner.host import sysfs

SCHEMA_VERSION = 1
COMPILERS = ("gcc", "clang", "cc", "aarch64-linux-gnu-gcc")
# File a recorded tree may hold with the output of `dmidecode -t memory`.
DMIDECODE_FILE = "dmidecode-t-memory.txt"
SOURCES = ("archspec", "cpuid-table", "none")


@dataclass(frozen=True)
class HostInfo:
    schema: int
    # CPU identity (/proc/cpuinfo). x86: vendor_id, family/model/stepping. Arm: vendor
    # is the implementer's name (ARM, Ampere, ...), implementer/part as hex.
    vendor: str
    family: int | None
    model: int | None
    stepping: int | None
    model_name: str
    implementer: str | None
    part: str | None
    # What the CPU is: an archspec name (zen5, sapphirerapids, neoverse_n1, ...), the
    # source that decided ("archspec" | "cpuid-table" | "none") and why.
    microarchitecture: str
    microarchitecture_source: str
    microarchitecture_reason: str
    archspec: str | None            # archspec's own answer (may be a generic level)
    arch: str                       # x86_64 | aarch64 | ...
    isa: tuple[str, ...]            # sorted /proc/cpuinfo flags (x86) / Features (Arm)
    cores: int | None               # physical
    threads: int | None             # logical, online
    sockets: int | None
    threads_per_core: int | None
    topology_source: str            # sysfs | cpu0-siblings | psutil | unknown
    caches: tuple[dict, ...]        # sysfs.caches(): level, type, size_bytes, line_size, ways, ...
    llc_bytes: int | None           # one last-level cache instance
    llc_total_bytes: int | None     # all instances together (what a working set must exceed)
    numa: dict                      # sysfs.numa(): nodes [{id, cpus, cpu_count, memory_bytes}], distances
    hugepages: dict                 # sysfs.hugepages(): thp_enabled, thp_defrag, hugetlb_pools
    memory_channels: int | None     # populated channels, all sockets; None = not knowable here
    memory_channels_reason: str     # how it was found, or why not
    memory_total_bytes: int | None
    compilers: dict                 # name -> {path, family, version, target} (absent ones omitted)
    bandwidth: dict | None          # tuner.host.bandwidth.measure() result
    bandwidth_reason: str | None    # why bandwidth is None
    profile: str                    # the matched target profile
    profile_reason: str
    host_id: str                    # tuner.hostid.host_id()
    fingerprint: str                # sha256 (16 hex) of identity()
    compute: dict | None = None     # tuner.host.peak.measure() result: GOP/s per unit and threads
    compute_reason: str | None = None  # why compute is None

    def to_dict(self) -> dict:
        """Plain JSON-ready dict (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, data: dict) -> "HostInfo":
        """Inverse of to_dict (unknown keys ignored, missing ones None)."""
        values = {f.name: data.get(f.name) for f in dataclasses.fields(cls)}
        values["isa"] = tuple(values["isa"] or ())
        values["caches"] = tuple(values["caches"] or ())
        return cls(**values)

    def identity(self) -> dict:
        return identity(self.to_dict())


# ---------------------------------------------------------------- fingerprint

def identity(info: dict) -> dict:
    """The fields the fingerprint covers: what the machine IS, never what it measures.

    CPU identity (arch, vendor, family, model, stepping, model name, Arm
    implementer/part), ISA flags, core/thread/socket counts, each cache's geometry,
    the NUMA shape (CPUs per node and distances, not memory sizes, which change with
    hot-plug and reservations) and the compilers' families and versions. Not
    bandwidth, free memory, THP settings or hugetlb pools: those change at run time
    on the same machine.
    """
    return {
        "arch": info["arch"], "vendor": info["vendor"], "family": info["family"],
        "model": info["model"], "stepping": info["stepping"], "model_name": info["model_name"],
        "implementer": info["implementer"], "part": info["part"],
        "isa": sorted(info["isa"]),
        "cores": info["cores"], "threads": info["threads"], "sockets": info["sockets"],
        "caches": [[c["level"], c["type"], c["size_bytes"], c["line_size"], c["ways"],
                    c["shared_cpu_count"]] for c in info["caches"]],
        "numa": {"cpus": [n["cpus"] for n in info["numa"].get("nodes", [])],
                 "distances": info["numa"].get("distances", [])},
        "compilers": {name: [c.get("family"), c.get("version")]
                      for name, c in sorted(info["compilers"].items())},
    }


def fingerprint(info: dict) -> str:
    """First 16 hex digits of SHA-256 over the canonical JSON of identity(info)."""
    text = json.dumps(identity(info), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- microarchitecture

def _archspec_targets() -> dict:
    try:
        from archspec.cpu import TARGETS
        return TARGETS
    except ImportError:
        return {}


def identify(cpu: _cpuinfo.CpuInfo, reg=None) -> tuple[str, str, str]:
    """(microarchitecture, source, reason) of `cpu`.

    archspec infers the microarchitecture from ISA flags; hypervisors hide flags
    (WAITPKG, CLZERO, ...), and archspec then reports an older core (an Emerald
    Rapids VM is "icelake") or a generic level (x86_64_v4). The profiles' match.cpuid
    entries list exact CPU identities (vendor/family/model, Arm implementer/part),
    which no hypervisor rewrites. Rule:
      - no profile lists the identity: archspec decides;
      - archspec agrees, or names a descendant of the listed core (cascadelake for
        the skylake_avx512 entry): archspec decides (it is more specific);
      - archspec falls back to a generic level, names an ancestor of the listed core,
        or disagrees: the identity table decides ("cpuid-table"), its name being the
        profile's first match.archspec entry (archspec vocabulary) or its name.
    """
    reg = _profiles.registry() if reg is None else reg
    listed = next((p for p in reg.values() if p.kind == "target"
                   and any(m.matches(cpu) for m in p.match.cpuid)), None)
    ident = _profiles._identity(cpu)
    name = cpu.archspec_name
    if listed is None:
        if name is None:
            return cpu.arch, "none", ("archspec is not installed and no profile lists this "
                                      f"CPU identity ({ident})")
        return name, "archspec", (f"archspec detects {name} from the ISA flags; no profile "
                                  f"lists the CPU identity ({ident})")
    table = listed.match.archspec[0] if listed.match.archspec else listed.name
    by_table = f"the CPU identity ({ident}) is listed by profile {listed.name}"
    if name is None:
        return table, "cpuid-table", f"{by_table}; archspec is not installed"
    if name == table or name in listed.match.archspec:
        return name, "archspec", f"archspec detects {name}; {by_table}, which agrees"
    targets = _archspec_targets()
    found, want = targets.get(name), targets.get(table)
    if found is not None and found.vendor == "generic":
        hidden = _hidden_flags(want, cpu)
        return table, "cpuid-table", (f"archspec falls back to the generic level {name} "
                                      f"(flags hidden{hidden}); {by_table}")
    if found is not None and want is not None and found in want.ancestors:
        hidden = _hidden_flags(want, cpu)
        return table, "cpuid-table", (f"archspec detects only {name}, an ancestor of {table} "
                                      f"(flags hidden{hidden}); {by_table}")
    if found is not None and want is not None and want in found.ancestors:
        return name, "archspec", (f"archspec detects {name}, a descendant of {table}; "
                                  f"{by_table}")
    return table, "cpuid-table", (f"archspec says {name}, unrelated to {table}; {by_table}, "
                                  f"and an identity is exact")


def _hidden_flags(target, cpu: _cpuinfo.CpuInfo, limit: int = 4) -> str:
    if target is None:
        return ""
    missing = sorted(set(target.features) - set(cpu.flags) - {"sse3"})
    if not missing:
        return ""
    more = f", +{len(missing) - limit} more" if len(missing) > limit else ""
    return f": {target.name} needs {', '.join(missing[:limit])}{more}"


def _vendor_name(cpu: _cpuinfo.CpuInfo) -> str:
    if cpu.arch != "aarch64":
        return cpu.vendor
    try:
        from archspec.cpu.schema import TARGETS_JSON
        return TARGETS_JSON["conversions"]["arm_vendors"].get(cpu.vendor, cpu.vendor)
    except ImportError:
        return cpu.vendor


# ---------------------------------------------------------------- memory channels

_SIZE = re.compile(r"^\s*(\d+)\s*(bytes|kB|MB|GB|TB)\s*$", re.I)
_CHANNEL = re.compile(r"CHANNEL[\s_-]*([A-Z0-9]+)", re.I)
_DIMM_LETTER = re.compile(r"DIMM[\s_-]*([A-Z])[\s_-]*\d+", re.I)
_SOCKET = re.compile(r"\b(PROC|CPU|SOCKET|P)[\s_-]*(\d+)", re.I)
_NODE = re.compile(r"NODE[\s_-]*(\d+)", re.I)


def _dmi_devices(text: str) -> list[dict[str, str]]:
    """The 'Memory Device' (DMI type 17) records of `dmidecode -t memory` output."""
    devices, current = [], None
    for line in text.splitlines():
        if line.strip() == "Memory Device":
            current = {}
            devices.append(current)
        elif current is not None and line.startswith("\t") and ":" in line:
            key, _, value = line.strip().partition(":")
            current.setdefault(key.strip(), value.strip())
        elif current is not None and not line.strip():
            current = None
    return devices


def channels_from_dmidecode(text: str) -> tuple[int | None, str]:
    """Populated memory channels (all sockets) from `dmidecode -t memory`, and how.

    A DIMM's channel is named by its locators on most servers: 'P0 CHANNEL A',
    'P0_Node0_Channel0_Dimm0' (AMD), 'CPU1_DIMM_A1', 'P1-DIMMA1' (the letter is the
    channel). When any populated DIMM has locators naming no channel ('A1', 'PROC 1
    DIMM 3'), the count is not knowable from DMI: None, with the reason.
    """
    devices = _dmi_devices(text)
    if not devices:
        return None, "dmidecode lists no memory devices (DMI type 17)"
    populated = [d for d in devices if _SIZE.match(d.get("Size", ""))
                 and not d.get("Size", "").startswith("0 ")]
    if not populated:
        return None, f"dmidecode lists {len(devices)} memory slots, none populated"
    keys = set()
    for d in populated:
        where = f"{d.get('Bank Locator', '')} {d.get('Locator', '')}"
        channel = _CHANNEL.search(where) or _DIMM_LETTER.search(where)
        if channel is None:
            return None, (f"dmidecode locators do not name channels (e.g. Locator "
                          f"'{d.get('Locator', '')}', Bank Locator '{d.get('Bank Locator', '')}'); "
                          f"{len(populated)} populated DIMMs")
        socket, node = _SOCKET.search(where), _NODE.search(where)
        keys.add((socket.group(2) if socket else "0", node.group(1) if node else "0",
                  channel.group(1).upper()))
    sockets = len({k[0] for k in keys})
    first = populated[0]
    return len(keys), (f"dmidecode: {len(populated)} populated DIMMs on {len(keys)} channels "
                       f"across {sockets} socket(s) (locators such as '{first.get('Locator', '')}' "
                       f"/ '{first.get('Bank Locator', '')}')")


def _run_dmidecode() -> tuple[str | None, str]:
    exe = shutil.which("dmidecode") or next(
        (p for p in ("/usr/sbin/dmidecode", "/sbin/dmidecode") if os.access(p, os.X_OK)), None)
    if exe is None:
        return None, ("dmidecode is not installed (Debian/Ubuntu: apt-get install dmidecode; "
                      "run the probe as root)")
    try:
        res = subprocess.run([exe, "-t", "memory"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"dmidecode failed to run: {exc}"
    if res.returncode != 0 or not res.stdout.strip():
        err = (res.stderr.strip().splitlines() or ["no output"])[-1]
        if "ermission" in err or os.geteuid() != 0:
            return None, f"dmidecode needs root to read the DMI tables ({err})"
        return None, f"dmidecode failed: {err}"
    return res.stdout, ""


def memory_channels(cpu: _cpuinfo.CpuInfo, root: str | os.PathLike, is_host: bool,
                    dmidecode_text: str | None = None) -> tuple[int | None, str]:
    """(populated channels or None, how it was found or why not)."""
    if "hypervisor" in cpu.flags:
        return None, ("virtual machine (hypervisor flag): DMI describes the hypervisor's virtual "
                      "DIMMs, not the host's memory channels")
    if dmidecode_text is None:
        if is_host:
            dmidecode_text, why = _run_dmidecode()
            if dmidecode_text is None:
                return None, why
        else:
            dmidecode_text = sysfs.read_text(root, DMIDECODE_FILE)
            if dmidecode_text is None:
                return None, f"no dmidecode output recorded ({DMIDECODE_FILE})"
    return channels_from_dmidecode(dmidecode_text)


# ---------------------------------------------------------------- compilers

def compilers(names=COMPILERS) -> dict:
    """name -> {path, family, version, target} for each compiler on PATH (absent omitted)."""
    out = {}
    for name in names:
        path = shutil.which(name)
        if path is None:
            continue
        try:
            comp = _profiles.probe_compiler(name)
            out[name] = {"path": comp.path, "realpath": os.path.realpath(comp.path),
                         "family": comp.family, "version": comp.version,
                         "target": comp.target_arch}
        except _profiles.ProfileError as exc:
            out[name] = {"path": path, "error": str(exc)}
    return out


# ---------------------------------------------------------------- probe

def _is_real_root(root: str | os.PathLike) -> bool:
    try:
        return Path(root).resolve() == Path("/").resolve()
    except OSError:
        return False


def _host_topology(topo: dict) -> dict:
    """psutil's counts where sysfs told nothing (non-Linux, locked-down containers)."""
    if topo["threads"] and topo["cores"]:
        return topo
    try:
        import psutil
        threads = psutil.cpu_count(logical=True)
        cores = psutil.cpu_count(logical=False)
    except Exception:
        return topo
    return {**topo, "threads": topo["threads"] or threads, "cores": topo["cores"] or cores,
            "threads_per_core": (threads // cores) if threads and cores else None,
            "source": "psutil"}


def _memory_total(root, is_host: bool) -> int | None:
    if is_host:
        try:
            import psutil
            return int(psutil.virtual_memory().total)
        except Exception:
            pass
    return sysfs.meminfo_total_bytes(root)


def probe(root: str | os.PathLike = "/", proc_cpuinfo: str | None = None,
          measure_bandwidth: bool = True, lib=None, *,
          bandwidth_threads=None, bandwidth_seconds: float = 0.3,
          measure_compute: bool | None = None,
          dmidecode_text: str | None = None, detect_compilers: bool = True,
          registry=None) -> HostInfo:
    """Probe the machine under `root` (see the module docstring).

    proc_cpuinfo: /proc/cpuinfo text (default: root/proc/cpuinfo, or this host's).
    measure_bandwidth: run the bandwidth kernels (real host only; a few seconds).
    lib: library for the kernels (None: this host's default, built if missing).
    bandwidth_threads / bandwidth_seconds: passed to tuner.host.bandwidth.measure, and
    to tuner.host.peak.measure (which takes two thirds of the seconds).
    measure_compute: run the compute-peak kernels (default: as measure_bandwidth).
    dmidecode_text: `dmidecode -t memory` output to use instead of running it.
    detect_compilers: look up COMPILERS on PATH (they belong to this machine even
    when probing a recorded tree).
    """
    is_host = proc_cpuinfo is None and _is_real_root(root)
    if proc_cpuinfo is not None:
        cpu = _cpuinfo.parse_cpuinfo(proc_cpuinfo)
    elif is_host:
        cpu = _cpuinfo.host_cpu()
    else:
        text = sysfs.read_text(root, "proc/cpuinfo")
        if text is None:
            raise FileNotFoundError(f"{Path(root) / 'proc/cpuinfo'}: no recorded /proc/cpuinfo")
        cpu = _cpuinfo.parse_cpuinfo(text)
    reg = _profiles.registry() if registry is None else registry

    uarch, source, why = identify(cpu, reg)
    topo = sysfs.topology(root)
    if is_host:
        topo = _host_topology(topo)
    cache_list = sysfs.caches(root)
    llc = sysfs.last_level_cache(cache_list)
    llc_total = sysfs.llc_total_bytes(cache_list, topo["threads"])
    channels, channels_why = memory_channels(cpu, root, is_host, dmidecode_text)

    if is_host and registry is None:
        profile = _hostid.host_profile_name()
        reasons = _profiles.match_host(cpu, reg)[1]
        host_id = _hostid.host_id()
    else:
        profile, reasons = _profiles.match_host(cpu, reg)
        host_id = _hostid.host_id(cpu, profile)

    fields: dict[str, Any] = dict(
        schema=SCHEMA_VERSION,
        vendor=_vendor_name(cpu), family=cpu.family, model=cpu.model, stepping=cpu.stepping,
        model_name=cpu.model_name,
        implementer=f"0x{cpu.implementer:02x}" if cpu.implementer is not None else None,
        part=f"0x{cpu.part:03x}" if cpu.part is not None else None,
        microarchitecture=uarch, microarchitecture_source=source, microarchitecture_reason=why,
        archspec=cpu.archspec_name, arch=cpu.arch, isa=tuple(sorted(cpu.flags)),
        cores=topo["cores"], threads=topo["threads"], sockets=topo["sockets"],
        threads_per_core=topo["threads_per_core"], topology_source=topo["source"],
        caches=tuple(cache_list), llc_bytes=llc["size_bytes"] if llc else None,
        llc_total_bytes=llc_total,
        numa=sysfs.numa(root), hugepages=sysfs.hugepages(root),
        memory_channels=channels, memory_channels_reason=channels_why,
        memory_total_bytes=_memory_total(root, is_host),
        compilers=compilers() if detect_compilers else {},
        bandwidth=None, bandwidth_reason=None,
        profile=profile, profile_reason=reasons.get(profile, ""),
        host_id=host_id, fingerprint="",
    )
    fields["fingerprint"] = fingerprint(json.loads(json.dumps(fields)))

    if not measure_bandwidth:
        fields["bandwidth_reason"] = "not measured (--no-bandwidth)"
    elif not is_host:
        fields["bandwidth_reason"] = "not measured: a recorded tree, not this machine"
    else:
        fields["bandwidth"], fields["bandwidth_reason"] = _measure(
            lib, bandwidth_threads, bandwidth_seconds, llc_total, topo)
    if not (measure_bandwidth if measure_compute is None else measure_compute):
        fields["compute_reason"] = "not measured (--no-compute)"
    elif not is_host:
        fields["compute_reason"] = "not measured: a recorded tree, not this machine"
    else:
        fields["compute"], fields["compute_reason"] = _measure_compute(
            lib, bandwidth_threads, bandwidth_seconds, topo)
    return HostInfo(**fields)


def _measure_compute(lib, threads, seconds, topo) -> tuple[dict | None, str | None]:
    from tuner.host import bandwidth, peak
    if threads is None:
        threads = bandwidth.thread_ladder(topo["threads"] or os.cpu_count() or 1, topo["cores"])
    try:
        return peak.measure(threads=threads, lib=lib, min_seconds=seconds * 2 / 3), None
    except Exception as exc:  # no compiler, failed build, old library: say so, keep probing
        first = str(exc).strip().splitlines()
        return None, f"compute peaks not measured: {type(exc).__name__}: {first[0] if first else ''}"


def _measure(lib, threads, seconds, llc_total, topo) -> tuple[dict | None, str | None]:
    from tuner.host import bandwidth
    if threads is None:
        threads = bandwidth.thread_ladder(topo["threads"] or os.cpu_count() or 1, topo["cores"])
    try:
        return bandwidth.measure(threads=threads, lib=lib, min_seconds=seconds,
                                 llc_bytes=llc_total), None
    except Exception as exc:  # no compiler, failed build, old library: say so, keep probing
        first = str(exc).strip().splitlines()
        return None, f"bandwidth not measured: {type(exc).__name__}: {first[0] if first else ''}"


# ---------------------------------------------------------------- text form

def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}" if n % div == 0 else f"{n / div:.1f} {unit}"
    return f"{n} B"


def format_text(info: HostInfo) -> str:
    """Human-readable summary of a HostInfo (what `python -m tuner probe` prints)."""
    lines = []
    ident = (f"{info.vendor} family {info.family} model {info.model} stepping {info.stepping}"
             if info.family is not None else
             f"{info.vendor} implementer {info.implementer} part {info.part}")
    lines.append(f"cpu           {info.model_name or '(no model name)'}  [{ident}]")
    lines.append(f"uarch         {info.microarchitecture}  (source: {info.microarchitecture_source}; "
                 f"{info.microarchitecture_reason})")
    lines.append(f"arch          {info.arch}, {len(info.isa)} ISA flags")
    lines.append(f"topology      {info.sockets or '?'} socket(s), {info.cores or '?'} cores, "
                 f"{info.threads or '?'} threads ({info.topology_source})")
    for c in info.caches:
        share = f", shared by {c['shared_cpu_count']} CPUs" if c["shared_cpu_count"] else ""
        lines.append(f"cache L{c['level']} {c['type']:<11} {_size(c['size_bytes'])}, "
                     f"{c['ways'] or '?'}-way, {c['line_size'] or '?'} B lines{share}")
    lines.append(f"llc total     {_size(info.llc_total_bytes)}")
    nodes = info.numa.get("nodes", [])
    lines.append(f"numa          {len(nodes)} node(s) ({info.numa.get('source')}): " + "; ".join(
        f"node{n['id']} cpus {n['cpus'] or '-'} mem {_size(n['memory_bytes'])}" for n in nodes))
    if info.numa.get("distances") and len(nodes) > 1:
        lines.append("              distances " + " | ".join(
            " ".join(str(d) for d in row) for row in info.numa["distances"]))
    hp = info.hugepages
    pools = ", ".join(f"{_size(p['page_size_bytes'])}: {p['nr']} ({p['free']} free)"
                      for p in hp.get("hugetlb_pools", [])) or "none"
    lines.append(f"hugepages     THP {hp.get('thp_enabled')} (defrag {hp.get('thp_defrag')}); "
                 f"hugetlb {pools}")
    lines.append(f"memory        {_size(info.memory_total_bytes)}; channels "
                 f"{info.memory_channels if info.memory_channels is not None else 'unknown'} "
                 f"({info.memory_channels_reason})")
    for name, c in info.compilers.items():
        lines.append(f"compiler      {name}: " + (f"{c['family']} {c['version']} ({c['path']}, "
                                                  f"targets {c['target']})"
                                                  if "error" not in c else f"broken: {c['error']}"))
    bw = info.bandwidth
    if bw is None:
        lines.append(f"bandwidth     {info.bandwidth_reason}")
    else:
        lines.append(f"bandwidth     read {bw['read_gbps']:.1f} GB/s ({bw['read_threads']} threads), "
                     f"triad {bw['triad_gbps']:.1f} GB/s ({bw['triad_threads']} threads); "
                     f"{_size(bw['bytes'])} working set, median pass")
        for row in bw["runs"]:
            r, tr = row["read"], row["triad"]
            lines.append(f"              {row['threads']:>3} threads: read {r['gbps']:7.2f} "
                         f"({r['worst_gbps']:.1f}-{r['best_gbps']:.1f})  triad {tr['gbps']:7.2f} "
                         f"({tr['worst_gbps']:.1f}-{tr['best_gbps']:.1f}) GB/s")
    cp = info.compute
    if cp is None:
        lines.append(f"compute       {info.compute_reason or 'not measured'}")
    else:
        lines.append("compute       GOP/s by threads (a multiply-add is 2), median pass")
        for row in cp["runs"]:
            lines.append(f"              {row['threads']:>3} threads: " + "  ".join(
                f"{kind} {fig['gops']:.0f}" for kind, fig in row.items() if kind != "threads"))
        for kind, why in cp.get("reasons", {}).items():
            lines.append(f"              {kind}: {why}")
    lines.append(f"profile       {info.profile} ({info.profile_reason})")
    lines.append(f"host id       {info.host_id}")
    lines.append(f"fingerprint   {info.fingerprint}")
    return "\n".join(lines)
