"""`scons profile=...` end to end, into a temporary build_dir (the repository's real sources)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_build import cpuinfo, parts, profiles, render

ROOT = Path(__file__).resolve().parents[2]


def scons(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run scons in the repository; the caller's COLIBRI_BUILD_DIR is dropped unless `env` sets it."""
    run_env = {k: v for k, v in os.environ.items() if k != "COLIBRI_BUILD_DIR"}
    run_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "SCons", "-Q", "-j2", *args], cwd=ROOT,
                          capture_output=True, text=True, env=run_env, timeout=600)


def output(res: subprocess.CompletedProcess) -> str:
    return res.stdout + res.stderr


def repo_state() -> set[str]:
    """Untracked and ignored paths outside build/: what a build must never add to."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    res = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return {line for line in res.stdout.splitlines()
            if not line[3:].startswith("build/") and "__pycache__" not in line
            and ".pytest_cache" not in line}


@pytest.fixture(scope="module")
def build_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("colibri-build")


@pytest.fixture(scope="module")
def generic(build_root):
    before = repo_state()
    res = scons("profile=generic", f"build_dir={build_root}")
    assert res.returncode == 0, output(res)
    return build_root / "generic", res, before


def test_generic_build_outputs(generic):
    bdir, res, _ = generic
    for name in ("libcolibri.so", "colibri_dump_schema", "build_info.json", "compile_commands.json"):
        assert (bdir / name).is_file(), f"{name} missing:\n{output(res)}"
    tables = parts.read_tables(bdir / "kernel_tables.json")
    assert list(tables) == ["default"] and set(tables["default"]) == set(parts.PARTS)
    for part, sym in tables["default"].items():
        text = (bdir / "gen" / "parts" / f"{sym}.c").read_text()
        assert text.startswith("/* GENERATED") and "isa=portable" in text.split("*/")[0]
        assert f"part: {part}" in text.split("*/")[0] and parts.object_path(bdir, sym).is_file()


def test_build_info(generic):
    bdir, _, _ = generic
    info = json.loads((bdir / "build_info.json").read_text())
    comp = profiles.probe_compiler("gcc")
    assert info["profile"] == "generic" and info["arch"] == cpuinfo.host_arch()
    assert info["kernel_isa"] == "portable" and info["knobs"]["isa"] == "portable"
    assert set(info["knobs"]) >= {"isa", "rows", "tok_block", "unroll", "prefetch_f32", "prefetch_bf16"}
    assert info["compiler"]["version"] == comp.version and info["compiler"]["family"] == "gcc"
    assert info["cflags"][:7] == ["-O3", "-fPIC", "-fopenmp", "-std=c11", "-ffp-contract=off", "-Wall", "-Wextra"]
    assert info["features"] == [] and info["config"] is None
    assert info["defines"]["COLIBRI_DEFAULT_HUGEPAGES"] == 1  # huge pages unless hugepages=off


def test_build_info_is_compiled_into_the_library(generic):
    bdir, _, _ = generic
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef("const char *colibri_build_info(void);")
    lib = ffi.dlopen(str(bdir / "libcolibri.so"))
    from_c = json.loads(ffi.string(lib.colibri_build_info()).decode())
    assert from_c == json.loads((bdir / "build_info.json").read_text())


def test_compile_commands(generic):
    bdir, _, _ = generic
    entries = json.loads((bdir / "compile_commands.json").read_text())
    files = {Path(e["file"]).name for e in entries}
    assert {"kernel_tables.c", "build_info.c"} <= files
    assert {f"{sym}.c" for sym in parts.read_tables(bdir / "kernel_tables.json")["default"].values()} <= files
    assert {p.name for p in (ROOT / "kernels").glob("*.c")} <= files
    for e in entries:
        assert e["directory"] == str(ROOT) and os.path.isabs(e["file"])
        assert "-Ikernels" in e["command"] and "-fopenmp" in e["command"]


def test_second_run_is_a_no_op(generic, build_root):
    res = scons("profile=generic", f"build_dir={build_root}")
    assert res.returncode == 0, output(res)
    assert "is up to date" in res.stdout
    assert " -o " not in res.stdout and "render " not in res.stdout, res.stdout


def test_build_writes_nothing_in_the_repository(generic):
    _, _, before = generic
    assert repo_state() == before


def test_knob_change_rerenders_only_the_kernels(generic, build_root, tmp_path):
    bdir, _, _ = generic
    config = render.write_config_h(tmp_path / "config.h", {"isa": "scalar", "rows": 1, "unroll": 1},
                                   "0123abcd", "generic")
    res = scons("profile=generic", f"build_dir={build_root}", f"config={config}")
    assert res.returncode == 0, output(res)
    assert "render " in res.stdout and "isa=scalar" in res.stdout
    assert "kernels/pool.c" not in res.stdout  # hand-written sources are untouched
    info = json.loads((bdir / "build_info.json").read_text())
    assert info["knobs"]["isa"] == "scalar" and info["knobs"]["rows"] == 1
    assert info["config"] == {"path": str(config.resolve()), "signature": "0123abcd", "profile": "generic"}
    before = parts.read_tables(bdir / "kernel_tables.json")["default"]
    for sym in before.values():
        assert "isa=scalar" in (bdir / "gen" / "parts" / f"{sym}.c").read_text().split("*/")[0]
    res = scons("profile=generic", f"build_dir={build_root}", f"config={config}")
    assert "render " not in res.stdout and " -o " not in res.stdout, res.stdout
    res = scons("profile=generic", f"build_dir={build_root}")  # back to the defaults
    assert res.returncode == 0, output(res)
    # the default knobs' parts are still compiled (named by their text): nothing renders or
    # compiles again but the list of tables
    assert "render " not in res.stdout and "gen/parts/" not in res.stdout, res.stdout
    after = parts.read_tables(bdir / "kernel_tables.json")["default"]
    assert all(before[p] != after[p] for p in parts.PARTS)
    assert all("isa=portable" in (bdir / "gen" / "parts" / f"{s}.c").read_text().split("*/")[0]
               for s in after.values())


def test_bad_config_is_refused(build_root, tmp_path):
    config = render.write_config_h(tmp_path / "config.h", {"isa": "avx512"}, "ab", "generic")
    res = scons("profile=generic", f"build_dir={build_root}", f"config={config}")
    assert res.returncode != 0 and "kernel isa" in res.stderr and "Traceback" not in output(res)
    config = render.write_config_h(tmp_path / "config.h", {"isa": "scalar"}, "ab", "zen4")
    res = scons("profile=generic", f"build_dir={build_root}", f"config={config}")
    assert res.returncode != 0 and "profile=zen4" in res.stderr


def test_x86_64_v4_build(build_root):
    if cpuinfo.host_arch() != "x86_64":
        pytest.skip("x86_64 host needed")
    res = scons("profile=x86-64-v4", f"build_dir={build_root}", "hugepages=off")
    assert res.returncode == 0, output(res)
    bdir = build_root / "x86-64-v4"
    info = json.loads((bdir / "build_info.json").read_text())
    assert info["kernel_isa"] == "avx512" and "avx512f" in info["features"]
    assert "-march=x86-64-v4" in info["cflags"] and info["defines"]["COLIBRI_DEFAULT_HUGEPAGES"] == 0
    assert (bdir / "libcolibri.so").is_file() and (bdir / "colibri_dump_schema").is_file()
    runnable, why = profiles.runs_on(profiles.get_profile("x86-64-v4"), cpuinfo.host_cpu())
    assert ("cannot run on this host" in res.stdout) is not runnable
    res = scons("profile=x86-64-v4", f"build_dir={build_root}", "hugepages=off")
    assert "is up to date" in res.stdout and " -o " not in res.stdout


def test_clean_removes_the_profile_directory(build_root):
    res = scons("-c", "profile=x86-64-v4", f"build_dir={build_root}")
    assert res.returncode == 0, output(res)
    assert not (build_root / "x86-64-v4").exists()


def test_unknown_profile_is_refused_with_the_list():
    res = scons("profile=zen9", "build_dir=/nonexistent-never-written")
    assert res.returncode != 0
    assert "unknown profile 'zen9'" in res.stderr and "sapphirerapids" in res.stderr
    assert "Traceback" not in output(res)


def test_unknown_option_is_refused():
    res = scons("profle=zen4")
    assert res.returncode != 0 and "profle" in res.stderr


def test_missing_cross_compiler_is_explained(build_root):
    prof = profiles.get_profile("neoverse-n1")
    if cpuinfo.host_arch() == "aarch64" or shutil.which(prof.cross["gcc"].cc):
        pytest.skip("the aarch64 compiler is available here")
    res = scons("profile=neoverse-n1", f"build_dir={build_root}")
    assert res.returncode != 0 and "Traceback" not in output(res)
    assert "aarch64-linux-gnu-gcc" in res.stderr and "gcc-aarch64-linux-gnu" in res.stderr
    assert not (build_root / "neoverse-n1").exists()


def test_help_documents_the_options():
    res = scons("-h")
    assert res.returncode == 0
    for option in ("profile:", "config:", "hugepages:", "cc:", "build_dir:"):
        assert option in res.stdout
    assert "sapphirerapids" in res.stdout


def test_build_dir_from_environment(tmp_path):
    res = scons("-n", "profile=generic", env={"COLIBRI_BUILD_DIR": str(tmp_path / "envbuild")})
    assert res.returncode == 0, output(res)
    assert str(tmp_path / "envbuild" / "generic") in res.stdout


def test_a_tuned_library_older_than_the_sources_is_not_used(tmp_path, monkeypatch):
    """After the engine's code changes, the tuned library (built from the old code) is
    skipped with a warning until the tuner runs again; a fresh one is used."""
    import os
    import shutil
    import warnings

    from colibri import _lib
    from colibri_build import hostid

    monkeypatch.delenv("COLIBRI_LIB", raising=False)
    lib = _lib.default_library_path()  # a real, current build to copy
    monkeypatch.setenv("COLIBRI_BUILD_DIR", str(tmp_path))
    default = tmp_path / hostid.host_profile_name() / "libcolibri.so"
    tuned = tmp_path / "tuned" / hostid.host_id() / "libcolibri.so"
    for p in (default, tuned):
        p.parent.mkdir(parents=True)
        shutil.copy(lib, p)
    os.utime(tuned, (0, 0))  # built long before the sources
    with pytest.warns(UserWarning, match="older than the engine's sources"):
        assert _lib.default_library_path() == default
    os.utime(tuned, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _lib.default_library_path() == tuned
