"""Memory cgroups for runs under a memory limit (the storage class, colibri_bench offload,
the memory-limit tests): a fresh group with a limit and no swap, a child process started inside it, its
OOM kills, and a file's pages dropped from the page cache so that a run reads them."""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path


class NoCgroup(RuntimeError):
    """No memory cgroup can be made here; the message says why."""


def cgroup_root() -> tuple[int, Path]:
    """(version, directory) of a memory cgroup hierarchy this process can create groups in:
    v2's memory.max where the unified hierarchy has the memory controller, else v1's
    memory.limit_in_bytes. Raises NoCgroup naming why not."""
    if sys.platform != "linux":
        raise NoCgroup("memory cgroups are Linux's")
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").is_file() and "memory" in (v2 / "cgroup.controllers").read_text().split():
        if os.access(v2 / "cgroup.subtree_control", os.W_OK):
            return 2, v2
        raise NoCgroup(f"{v2} has the memory controller but is not writable (root needed)")
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").is_file():
        if os.access(v1, os.W_OK):
            return 1, v1
        raise NoCgroup(f"{v1} is not writable (root needed)")
    raise NoCgroup("no memory cgroup hierarchy is mounted (neither v2 memory.max nor v1 memory/)")


@contextmanager
def memory_cgroup(limit: int, tag: str = "colibri"):
    """A fresh cgroup limited to `limit` bytes of memory (page cache included), no swap;
    yields (version, path) and removes it after (its processes must have exited)."""
    version, root = cgroup_root()
    path = root / f"{tag}-{os.getpid()}"
    try:
        path.mkdir()
        if version == 2:
            (path / "memory.max").write_text(str(int(limit)))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
        else:
            (path / "memory.limit_in_bytes").write_text(str(int(limit)))
            if (path / "memory.memsw.limit_in_bytes").exists():
                (path / "memory.memsw.limit_in_bytes").write_text(str(int(limit)))
    except OSError as e:
        if path.exists():
            path.rmdir()
        raise NoCgroup(f"cannot set up a memory cgroup under {root}: {e}") from e
    try:
        yield version, path
    finally:
        path.rmdir()


def oom_kills(version: int, path: Path) -> int:
    """OOM kills in the group so far (0 where a v1 kernel does not count them: the exit
    status tells then)."""
    name = "memory.events" if version == 2 else "memory.oom_control"
    for line in (path / name).read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def run_in(cg: Path, cmd: list[str], timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """cmd in cgroup cg: the child joins it before it execs."""
    procs = cg / "cgroup.procs"
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          preexec_fn=lambda: procs.write_text(str(os.getpid())))


def drop_from_page_cache(path: str | os.PathLike) -> None:
    """The file's clean pages out of the page cache, so the next run reads (and is charged
    for) what it needs."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
