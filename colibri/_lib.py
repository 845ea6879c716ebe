"""Finding, (building) and opening libcolibri.so through cffi (ABI mode).

The declarations come from the CFFI block of kernels/colibri.h, so the header is
the single source of truth for the C API.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import sys
import threading
import warnings
from pathlib import Path

import cffi

from colibri_build import hostid, scons
from colibri_build.paths import HEADER, build_dir_default, newest_source_mtime

_lock = threading.Lock()
_opened: dict[str, object] = {}


class ColibriError(RuntimeError):
    """A call into the C engine failed; the message is the engine's own."""


class LibraryNotFound(ColibriError):
    """No usable libcolibri.so could be found or built."""


def _cdef_source() -> str:
    text = HEADER.read_text()
    m = re.search(r"/\* CFFI-BEGIN \*/(.*?)/\* CFFI-END \*/", text, re.S)
    if not m:
        raise LibraryNotFound(f"{HEADER} has no CFFI-BEGIN/CFFI-END block")
    return m.group(1)


ffi = cffi.FFI()
ffi.cdef(_cdef_source())


def default_library_path() -> Path:
    """The library this host should use, building the default one if missing.

    Order: $COLIBRI_LIB; the tuned library for this host
    (build/tuned/<host-id>/libcolibri.so); the default build of the profile that
    matches this host (built with scons on first use).
    """
    env = os.environ.get("COLIBRI_LIB")
    if env:
        return Path(env)
    tuned = hostid.tuned_library_path(build_dir_default())
    if tuned is not None and tuned.exists():
        if is_current(tuned):
            return tuned
        warnings.warn(f"colibri: the tuned library {tuned} is older than the engine's sources; "
                      "using the default build (re-run `python -m tuner run` to tune again)",
                      stacklevel=2)
    return current_default_build(hostid.host_profile_name())


def is_current(lib: Path) -> bool:
    """Whether a library is at least as new as the engine's sources."""
    return lib.stat().st_mtime >= newest_source_mtime()


def current_default_build(profile: str, build_dir: str | os.PathLike | None = None,
                          quiet: bool = False) -> Path:
    """The profile's default library, (re)built when missing or older than the sources."""
    path = Path(build_dir or build_dir_default()) / profile / "libcolibri.so"
    if not path.exists() or not is_current(path):
        build_profile(profile, build_dir=build_dir, quiet=quiet)  # scons rebuilds only what changed
        os.utime(path)  # and found the rest up to date: checked as of now
    return path


def build_profile(profile: str, *, config: str | os.PathLike | None = None,
                  build_dir: str | os.PathLike | None = None, quiet: bool = False) -> Path:
    """Run `scons profile=NAME [config=..] [build_dir=..]` in the repository; returns the library."""
    out = Path(build_dir) if build_dir is not None else build_dir_default()
    if not quiet:
        print(f"colibri: building the library for profile '{profile}' (scons profile={profile}"
              f"{f' config={config}' if config else ''})", file=sys.stderr)
    args = [f"profile={profile}", f"build_dir={out}"]
    if config is not None:
        args.append(f"config={config}")
    res = scons.run(*args)
    if res.returncode != 0:
        raise LibraryNotFound(
            f"building profile '{profile}' failed (exit {res.returncode}):\n"
            f"{res.stdout[-4000:]}{res.stderr[-4000:]}")
    return out / profile / "libcolibri.so"


def open_library(path: str | os.PathLike | None = None):
    """Open (once per path) and return the cffi library object."""
    p = Path(path) if path is not None else default_library_path()
    key = str(p.resolve())
    with _lock:
        lib = _opened.get(key)
        if lib is None:
            if not p.exists():
                raise LibraryNotFound(f"no library at {p}")
            problem = hostid.library_mismatch(p)
            if problem:
                raise LibraryNotFound(problem)
            check_sanitizer_runtime(p)
            # never unloaded: at interpreter exit cffi would dlclose it, and with it the
            # OpenMP runtime, while its worker threads still spin in that runtime's code
            # after the last parallel region (a segfault at exit, 5-25% of short runs)
            lib = ffi.dlopen(key, ffi.RTLD_NOW | ffi.RTLD_NODELETE)
            _opened[key] = lib
    return lib


def check_sanitizer_runtime(lib_path: str | os.PathLike) -> None:
    """Refuse an AddressSanitizer build (scons profile=asan) when this process lacks the
    ASan runtime: dlopen() would not fail but abort the whole interpreter ("ASan runtime
    does not come first in initial library list"). Raises LibraryNotFound with the fix."""
    info_path = Path(lib_path).with_name("build_info.json")
    try:
        flags = json.loads(info_path.read_text()).get("cflags", [])
    except (OSError, ValueError, AttributeError):
        return  # no build info: a hand-built library, nothing to go by
    asan = any(str(f).startswith("-fsanitize=") and "address" in str(f).split("=", 1)[1].split(",")
               for f in flags)
    if not asan:
        return
    try:  # the runtime's entry point is visible process-wide once it is loaded
        getattr(ctypes.CDLL(None), "__asan_init")
        return
    except AttributeError:
        pass
    raise LibraryNotFound(
        f"{lib_path} is built with AddressSanitizer, whose runtime must be loaded before "
        f"Python starts: run with LD_PRELOAD=$(gcc -print-file-name=libasan.so) "
        f"ASAN_OPTIONS=detect_leaks=0 (scripts/sanitize does this)")


def last_error(lib) -> str:
    return ffi.string(lib.colibri_last_error()).decode("utf-8", "replace")


def check(lib, status: int, what: str) -> None:
    if status != 0:
        raise ColibriError(f"{what}: {last_error(lib)}")
