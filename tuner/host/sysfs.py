"""Read the host's CPU topology, caches, NUMA and huge-page state from sysfs.

Every function takes `root`, the directory that stands for "/" (the real one, or a
recorded tree under tests/fixtures/hosts/<name>/), and reads only small text files
below it: nothing here runs a command or needs privileges. A file that is missing
or unreadable yields None / an empty result, never an exception: a container or an
old kernel may hide any of them, and the probe reports what it could not learn.

Paths read (relative to root):
  sys/devices/system/cpu/online                         logical CPUs
  sys/devices/system/cpu/cpuN/topology/...              cores, threads, packages
  sys/devices/system/cpu/cpu0/cache/index*/...          caches seen by CPU 0
  sys/devices/system/node/node*/{cpulist,distance,meminfo}   NUMA
  sys/kernel/mm/transparent_hugepage/{enabled,defrag}   THP mode
  sys/kernel/mm/hugepages/hugepages-*kB/{nr,free,...}_hugepages   hugetlb pools
  proc/meminfo                                          total memory (recorded trees)
"""
from __future__ import annotations

import os
import re
from pathlib import Path

CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"
THP_DIR = "sys/kernel/mm/transparent_hugepage"
HUGETLB_DIR = "sys/kernel/mm/hugepages"

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _path(root: str | os.PathLike, rel: str) -> Path:
    return Path(root) / rel


def read_text(root: str | os.PathLike, rel: str) -> str | None:
    """Stripped content of root/rel, or None if it is absent or unreadable."""
    try:
        return _path(root, rel).read_text(errors="replace").strip()
    except OSError:
        return None


def read_int(root: str | os.PathLike, rel: str) -> int | None:
    text = read_text(root, rel)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_cpulist(text: str | None) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]; '' or None -> []."""
    cpus: list[int] = []
    for part in (text or "").replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return sorted(set(cpus))


def format_cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8' (the kernel's own spelling)."""
    out, run = [], []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_size(text: str | None) -> int | None:
    """sysfs cache sizes: '48K' -> 49152, '2048K', '32M'; None if unparsable."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text or "", re.I)
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).upper()] if m else None


# ---------------------------------------------------------------- CPUs

def online_cpus(root: str | os.PathLike = "/") -> list[int]:
    """Logical CPUs online; falls back to the cpuN directories present."""
    cpus = parse_cpulist(read_text(root, f"{CPU_DIR}/online"))
    if cpus:
        return cpus
    d = _path(root, CPU_DIR)
    try:
        return sorted(int(p.name[3:]) for p in d.iterdir() if re.fullmatch(r"cpu\d+", p.name))
    except OSError:
        return []


def _first_cpulist(root, cpu: int, *names: str) -> list[int]:
    for name in names:
        cpus = parse_cpulist(read_text(root, f"{CPU_DIR}/cpu{cpu}/topology/{name}"))
        if cpus:
            return cpus
    return []


def topology(root: str | os.PathLike = "/") -> dict:
    """threads (logical CPUs online), cores (physical), sockets, threads_per_core, source.

    Exact when every online CPU has its topology files (the real /sys): distinct
    (package, core) pairs. A recorded tree may keep only cpu0's; then cores and
    sockets are derived from cpu0's sibling lists, assuming a symmetric machine
    (source "cpu0-siblings"). None where nothing tells.
    """
    cpus = online_cpus(root)
    threads = len(cpus) or None
    pairs, packages = set(), set()
    for cpu in cpus:
        pkg = read_int(root, f"{CPU_DIR}/cpu{cpu}/topology/physical_package_id")
        core = read_int(root, f"{CPU_DIR}/cpu{cpu}/topology/core_id")
        if pkg is None or core is None:
            break
        pairs.add((pkg, core))
        packages.add(pkg)
    else:
        if pairs:
            return {"threads": threads, "cores": len(pairs), "sockets": len(packages),
                    "threads_per_core": threads // len(pairs) if threads else None,
                    "source": "sysfs"}
    first = cpus[0] if cpus else 0
    siblings = _first_cpulist(root, first, "core_cpus_list", "thread_siblings_list")
    package = _first_cpulist(root, first, "package_cpus_list", "core_siblings_list")
    if threads and siblings:
        return {"threads": threads, "cores": threads // len(siblings),
                "sockets": (threads // len(package)) if package else None,
                "threads_per_core": len(siblings), "source": "cpu0-siblings"}
    return {"threads": threads, "cores": None, "sockets": None, "threads_per_core": None,
            "source": "unknown"}


# ---------------------------------------------------------------- caches

def caches(root: str | os.PathLike = "/", cpu: int = 0) -> list[dict]:
    """The caches CPU `cpu` sees, from its cache/index*/ directories, L1 first.

    Each: level, type (Data, Instruction, Unified), size_bytes, line_size, ways,
    sets, shared_cpu_count (CPUs sharing this one instance), shared_cpu_list.
    A field the kernel does not report (some Arm/VM kernels omit ways) is None.
    """
    base = _path(root, f"{CPU_DIR}/cpu{cpu}/cache")
    try:
        dirs = sorted(p for p in base.iterdir() if re.fullmatch(r"index\d+", p.name))
    except OSError:
        return []
    out = []
    for d in dirs:
        rel = f"{CPU_DIR}/cpu{cpu}/cache/{d.name}"
        level = read_int(root, f"{rel}/level")
        if level is None:
            continue
        shared = parse_cpulist(read_text(root, f"{rel}/shared_cpu_list"))
        out.append({
            "level": level,
            "type": read_text(root, f"{rel}/type") or "Unified",
            "size_bytes": parse_size(read_text(root, f"{rel}/size")),
            "line_size": read_int(root, f"{rel}/coherency_line_size"),
            "ways": read_int(root, f"{rel}/ways_of_associativity"),
            "sets": read_int(root, f"{rel}/number_of_sets"),
            "shared_cpu_count": len(shared) or None,
            "shared_cpu_list": format_cpulist(shared) if shared else None,
        })
    order = {"Data": 0, "Instruction": 1, "Unified": 2}
    out.sort(key=lambda c: (c["level"], order.get(c["type"], 3)))
    return out


def last_level_cache(cache_list: list[dict]) -> dict | None:
    """The highest-level data/unified cache (None if no cache is known)."""
    data = [c for c in cache_list if c["type"] != "Instruction" and c["size_bytes"]]
    return max(data, key=lambda c: (c["level"], c["size_bytes"]), default=None)


def llc_total_bytes(cache_list: list[dict], threads: int | None) -> int | None:
    """Last-level cache capacity of the whole machine: one instance's size times the
    number of instances (threads / CPUs sharing one). A working set must exceed this,
    not one instance, or threads spread over several L3s (Zen CCDs, sockets) would
    stream from cache."""
    llc = last_level_cache(cache_list)
    if llc is None:
        return None
    share = llc["shared_cpu_count"] or threads or 1
    instances = max(1, -(-(threads or share) // share))
    return llc["size_bytes"] * instances


# ---------------------------------------------------------------- NUMA

def _meminfo_total_kb(text: str | None) -> int | None:
    m = re.search(r"MemTotal:\s*(\d+)\s*kB", text or "")
    return int(m.group(1)) if m else None


def numa(root: str | os.PathLike = "/") -> dict:
    """NUMA nodes (id, cpus, cpu_count, memory_bytes) and the distance matrix.

    distances[i][j] is the kernel's relative distance from node i to node j (10 =
    local), rows in node order. Without a node directory (a kernel without NUMA)
    the machine is one node holding every CPU (source "assumed").
    """
    base = _path(root, NODE_DIR)
    try:
        ids = sorted(int(p.name[4:]) for p in base.iterdir() if re.fullmatch(r"node\d+", p.name))
    except OSError:
        ids = []
    if not ids:
        cpus = online_cpus(root)
        return {"source": "assumed",
                "nodes": [{"id": 0, "cpus": format_cpulist(cpus), "cpu_count": len(cpus),
                           "memory_bytes": meminfo_total_bytes(root)}],
                "distances": [[10]]}
    nodes, distances = [], []
    for i in ids:
        rel = f"{NODE_DIR}/node{i}"
        cpus = parse_cpulist(read_text(root, f"{rel}/cpulist"))
        kb = _meminfo_total_kb(read_text(root, f"{rel}/meminfo"))
        nodes.append({"id": i, "cpus": format_cpulist(cpus), "cpu_count": len(cpus),
                      "memory_bytes": kb * 1024 if kb is not None else None})
        row = read_text(root, f"{rel}/distance")
        distances.append([int(x) for x in row.split()] if row else [])
    if any(len(row) != len(ids) for row in distances):
        distances = []  # a partial matrix would mislead: report none
    return {"source": "sysfs", "nodes": nodes, "distances": distances}


# ---------------------------------------------------------------- huge pages

def _selected(text: str | None) -> str | None:
    """'always [madvise] never' -> 'madvise'; a file without brackets -> its text."""
    if text is None:
        return None
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else (text.split()[0] if text.split() else None)


def hugepages(root: str | os.PathLike = "/") -> dict:
    """THP mode (enabled, defrag: the bracketed choice) and the hugetlb pools.

    pools: one per page size, sorted: page_size_bytes, nr (reserved pages), free,
    resv, surplus. None for a value the kernel does not report.
    """
    pools = []
    base = _path(root, HUGETLB_DIR)
    try:
        dirs = [p for p in base.iterdir() if re.fullmatch(r"hugepages-\d+kB", p.name)]
    except OSError:
        dirs = []
    for d in dirs:
        rel = f"{HUGETLB_DIR}/{d.name}"
        pools.append({
            "page_size_bytes": int(d.name[len("hugepages-"):-2]) * 1024,
            "nr": read_int(root, f"{rel}/nr_hugepages"),
            "free": read_int(root, f"{rel}/free_hugepages"),
            "resv": read_int(root, f"{rel}/resv_hugepages"),
            "surplus": read_int(root, f"{rel}/surplus_hugepages"),
        })
    pools.sort(key=lambda p: p["page_size_bytes"])
    return {"thp_enabled": _selected(read_text(root, f"{THP_DIR}/enabled")),
            "thp_defrag": _selected(read_text(root, f"{THP_DIR}/defrag")),
            "hugetlb_pools": pools}


# ---------------------------------------------------------------- memory

def meminfo_total_bytes(root: str | os.PathLike = "/") -> int | None:
    """MemTotal of root/proc/meminfo, else the sum of the NUMA nodes' MemTotal."""
    kb = _meminfo_total_kb(read_text(root, "proc/meminfo"))
    if kb is not None:
        return kb * 1024
    base = _path(root, NODE_DIR)
    try:
        texts = [read_text(root, f"{NODE_DIR}/{p.name}/meminfo") for p in base.iterdir()
                 if re.fullmatch(r"node\d+", p.name)]
    except OSError:
        return None
    kbs = [_meminfo_total_kb(t) for t in texts]
    return sum(kbs) * 1024 if kbs and None not in kbs else None
