"""python -m tuner verify: a profile's library against the NumPy reference, under qemu-user
for an Arm profile on this host (tuner/fleet/verify.py)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_build import profiles
from tuner.fleet import verify

ARM_TOOLS = ("aarch64-linux-gnu-gcc", "qemu-aarch64")
needs_arm = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ARM_TOOLS) or not Path("/usr/aarch64-linux-gnu/lib").is_dir(),
    reason="no Arm cross toolchain or qemu-user (`scripts/setup --test` installs them)")


@needs_arm
@pytest.mark.parametrize("profile", ["armv8-a", "neoverse-n1"])
def test_verify_passes_for_an_arm_profile_under_qemu(tmp_path, profile):
    res = subprocess.run([sys.executable, "-m", "tuner", "verify", "--profile", profile,
                          "--build-dir", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert "under qemu-user, not timed" in res.stdout
    checks = sum(len(c.tokens) for c in verify.CASES) * len(verify.DTYPES)
    assert f"{checks + 1} passed, 0 failed" in res.stdout  # the kernel checks and the C API test
    for dtype in verify.DTYPES:
        assert f"softmax_topk       {dtype}" in res.stdout
    assert "C API test" in res.stdout and " 0 failed" in res.stdout


def test_a_wrong_output_fails_the_kernel_check(tmp_path):
    """A program that returns its input (no MoE added) fails every check it runs."""
    fake = tmp_path / "fake_infer"
    fake.write_text(f"#!{sys.executable}\nimport shutil, sys\nshutil.copyfile(sys.argv[2], sys.argv[4])\n")
    fake.chmod(0o755)
    rows = verify.kernel_check(fake, [], tmp_path, dtypes=("f32", "int4g32"), cases=verify.CASES[:1])
    assert len(rows) == 2 * len(verify.CASES[0].tokens)
    assert not any(r.ok for r in rows)
    assert all("relative error" in r.message for r in rows)


def test_a_missing_emulator_is_named_with_its_package(monkeypatch):
    monkeypatch.setattr(verify.shutil, "which", lambda exe: None)
    monkeypatch.setattr(verify.cpuinfo, "host_cpu", lambda: type("H", (), {"arch": "x86_64"})())
    with pytest.raises(verify.VerifyError, match="qemu-aarch64 is not installed.*qemu-user"):
        verify._runner(profiles.get_profile("armv8-a"))


def test_an_unknown_profile_is_a_usage_error():
    res = subprocess.run([sys.executable, "-m", "tuner", "verify", "--profile", "zen99"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "zen99" in res.stderr
