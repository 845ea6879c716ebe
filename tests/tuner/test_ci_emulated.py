"""tuner ci --profile P --emulated: an Arm profile's defaults cross-built, verified under
qemu-user, ISA-checked and packed as colibri-<profile>-emulated.tar.gz (tuner/fleet/emulated.py)."""
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from colibri_build import profiles, render
from tuner.build import isacheck
from tuner.fleet import emulated

ARM_TOOLS = ("aarch64-linux-gnu-gcc", "qemu-aarch64", "aarch64-linux-gnu-objdump")
needs_arm = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ARM_TOOLS) or not Path("/usr/aarch64-linux-gnu/lib").is_dir(),
    reason="no Arm cross toolchain or qemu-user (`scripts/setup --test` installs them)")
MEMBERS = ("config.h", "libcolibri.so", "build_info.json", "colibri.h", "manifest.json", "report.md",
           "report.html")


def _ci(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "tuner", "ci", *args], capture_output=True, text=True,
                          timeout=timeout)


@needs_arm
def test_neoverse_n1_artifact_says_emulated_not_timed_and_passes_its_isa_check(tmp_path):
    out = tmp_path / "out"
    res = _ci("--profile", "neoverse-n1", "--emulated", "--out", str(out), "--build-dir", str(tmp_path / "b"),
              "--json")
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    art = json.loads(res.stdout)
    name = "colibri-neoverse-n1-emulated"
    assert art["tarball"] == str(out / f"{name}.tar.gz")
    assert sorted(p.name for p in out.iterdir()) == [f"{name}.tar.gz"]  # no staging left
    with tarfile.open(art["tarball"]) as tar:
        assert sorted(tar.getnames()) == sorted(f"{name}/{m}" for m in MEMBERS)
        manifest = json.load(tar.extractfile(f"{name}/manifest.json"))
        md = tar.extractfile(f"{name}/report.md").read().decode()
        page = tar.extractfile(f"{name}/report.html").read().decode()
        config = tar.extractfile(f"{name}/config.h").read().decode()
        lib = tar.extractfile(f"{name}/libcolibri.so").read()
    assert manifest["status"] == "emulated, not timed"
    assert "verified under qemu-user, not timed" in manifest["note"]
    assert md.splitlines()[0].endswith("emulated, not timed")
    assert "Verified under qemu-user, not timed." in md and "not timed" in page
    # every kernel check passed, and the ISA check required SDOT and found it
    assert manifest["verify"] and all(r["ok"] for r in manifest["verify"])
    assert {r["dtype"] for r in manifest["verify"]} >= {"f32", "bf16", "int8", "int4g32"}
    isa = manifest["isa_check"]
    assert isa["ok"] is True and "sdot" in isa["promised"]["require"] and isa["found"]["sdot"] > 0
    # config.h: the profile's defaults, generated; the library an aarch64 ELF
    prof = profiles.get_profile("neoverse-n1")
    assert render.parse_config_h(config).knobs == emulated.default_knobs(prof)
    assert "GENERATED" in config
    assert lib[:4] == b"\x7fELF" and int.from_bytes(lib[18:20], "little") == 183


@needs_arm
def test_a_failed_isa_check_packs_nothing(tmp_path, monkeypatch):
    def broken(lib, **kw):
        return isacheck.IsaCheck(ok=False, library=str(lib), arch="aarch64", isa="neon",
                                 message="isa=neon with the profile's feature asimddp promises sdot instructions, but the kernel symbols use none")
    monkeypatch.setattr(emulated.isacheck, "check_library", broken)
    out = tmp_path / "out"
    with pytest.raises(emulated.EmulatedError, match="ISA CHECK FAILED.*sdot"):
        emulated.build_artifact("neoverse-n1", out, build_dir=tmp_path / "b", say=lambda *a: None)
    assert list(out.iterdir()) == []


def test_emulated_needs_a_profile_of_another_architecture(tmp_path):
    res = _ci("--emulated", "--out", str(tmp_path), timeout=120)
    assert res.returncode == 2 and "--emulated needs --profile" in res.stderr
    res = _ci("--emulated", "--profile", "zen99", "--out", str(tmp_path), timeout=120)
    assert res.returncode == 2 and "zen99" in res.stderr
    res = _ci("--emulated", "--profile", "generic", "--out", str(tmp_path), timeout=120)
    assert res.returncode == 1 and "this host's architecture" in res.stderr
    assert list(tmp_path.iterdir()) == []
