"""The Arm profiles, cross-built on this x86_64 host and run under qemu-user.

Each Arm profile's library is built with the cross compiler its profile names, and
kernels/tools/infer_model.c (a program that uses nothing but colibri.h) is cross-built against
it and run under qemu-aarch64 on model files written here. Its outputs must be the native
library's on the same files: f32 within 1e-5 relative L2, the other weight dtypes within
2e-2. The models have two layers, a shared expert with its sigmoid gate, a dynamic expert
count and one expert tensor stored once for both layers. The tools come from
`scripts/setup --test` (Debian's gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user);
without them these tests skip and say so.
"""
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri import _lib
from colibri_build import profiles

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "kernels" / "tools" / "infer_model.c"
ARM_PROFILES = ("armv8-a", "neoverse-n1", "neoverse-v2", "apple-m1")
CROSS_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", Path("/usr/aarch64-linux-gnu")
OBJDUMP = "aarch64-linux-gnu-objdump"
# instructions a profile's library must contain: FMLA on 4 f32 lanes everywhere (the NEON
# kernels), SDOT where the profile requires the dot product (/proc/cpuinfo's asimddp), and
# with the default knobs SMMLA (i8mm) and BFMMLA (bf16) where it has those
ISA_INSTRUCTIONS = [(None, r"\bfmla\s+v\d+\.4s"), ("asimddp", r"\bsdot\s+v\d+\.4s"),
                    ("i8mm", r"\bsmmla\s+v\d+\.4s"), ("bf16", r"\bbfmmla\s+v\d+\.4s")]
DTYPES = ("f32", "bf16", "int8", "int4g32", "int4")
TOLERANCE = {"f32": 1e-5, "bf16": 2e-2, "int8": 2e-2, "int4g32": 2e-2, "int4": 2e-2}
TOKENS = (1, 40)

_missing = [t for t in (CROSS_CC, QEMU, OBJDUMP) if shutil.which(t) is None]
if not (SYSROOT / "lib").is_dir():
    _missing.append(f"{SYSROOT}/lib (libc6-dev-arm64-cross)")
pytestmark = pytest.mark.skipif(
    bool(_missing), reason=f"no Arm cross toolchain or emulator ({', '.join(_missing)}): "
    "`scripts/setup --test` installs gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user")

EM_AARCH64 = 183


def _elf_machine(path: Path) -> int:
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return int.from_bytes(head[18:20], "little")


def _compile(cc: str, lib: Path, out: Path) -> Path:
    cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'kernels'}", str(SOURCE),
           "-o", str(out), str(lib), f"-Wl,-rpath,{lib.parent}", "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}{res.stderr}"
    return out


def _layer(rng, H, I, E, S, gate=None):
    w = lambda *shape: rng.standard_normal(shape, dtype=np.float32) * 0.1
    return dict(router=w(E, H), gate=w(E, I, H) if gate is None else gate, up=w(E, I, H),
                down=w(E, H, I), top_k=2, dyn_p=0.6, k_min=1, k_max=3,
                shared_gate=w(S, H), shared_up=w(S, H), shared_down=w(H, S), shared_expert_gate=w(H))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """dtype -> model file, and T -> input file; hidden 48 and inter 40 leave ragged groups."""
    d = tmp_path_factory.mktemp("arm_models")
    rng = np.random.default_rng(17)
    H, I, E, S = 48, 40, 6, 24
    first = _layer(rng, H, I, E, S)
    layers = [first, _layer(rng, H, I, E, S, gate=first["gate"])]  # one gate tensor for both
    files = {}
    for dt in DTYPES:
        files[dt] = d / f"m-{dt}.colibri"
        info = colibri.save_model(files[dt], layers, weight_dtype=dt)
        # a slot per layer for each expert's gate, up and down, the router and the shared
        # expert's four tensors; layer 1's E gate slots name layer 0's tensors
        assert info["n_slots"] == 2 * (3 * E + 5) and info["n_tensors"] == info["n_slots"] - E, info
    inputs = {}
    for T in TOKENS:
        inputs[T] = d / f"x-{T}.f32"
        rng.standard_normal((T, H), dtype=np.float32).tofile(inputs[T])
    return files, inputs, H


def _run(cmd, what):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{what}: exit {res.returncode}\n{res.stdout}{res.stderr[-4000:]}"


@pytest.fixture(scope="module")
def native_outputs(models, tmp_path_factory):
    files, inputs, H = models
    d = tmp_path_factory.mktemp("native")
    lib = Path(_lib.default_library_path()).resolve()
    prog = _compile(shutil.which("cc") or "gcc", lib, d / "infer_model")
    out = {}
    for dt, model in files.items():
        for T, x in inputs.items():
            path = d / f"y-{dt}-{T}.f32"
            _run([str(prog), str(model), str(x), str(T), str(path)], f"native {dt} T={T}")
            out[dt, T] = np.fromfile(path, dtype=np.float32).reshape(T, H)
    return out


@pytest.mark.parametrize("profile", ARM_PROFILES)
def test_arm_profile_matches_the_native_library(profile, models, native_outputs, tmp_path):
    files, inputs, H = models
    lib = _lib.build_profile(profile, build_dir=tmp_path / "build", quiet=True)
    assert _elf_machine(lib) == EM_AARCH64, f"{lib} is not an aarch64 ELF"
    asm = subprocess.run([OBJDUMP, "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    features = profiles.get_profile(profile).features
    for feature, pattern in ISA_INSTRUCTIONS:
        if feature is None or feature in features:
            assert re.search(pattern, asm), f"{profile}: no /{pattern}/ in the library's disassembly"
    prog = _compile(CROSS_CC, lib, tmp_path / "infer_model")
    assert _elf_machine(prog) == EM_AARCH64
    worst = {}
    for dt, model in files.items():
        for T, x in inputs.items():
            path = tmp_path / f"y-{dt}-{T}.f32"
            _run([QEMU, "-L", str(SYSROOT), str(prog), str(model), str(x), str(T), str(path)],
                 f"{profile} under qemu, {dt} T={T}")
            got, want = np.fromfile(path, dtype=np.float32).reshape(T, H), native_outputs[dt, T]
            assert np.isfinite(got).all(), f"{profile} {dt} T={T}: non-finite outputs"
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            worst[dt, T] = err
    bad = {k: v for k, v in worst.items() if v > TOLERANCE[k[0]]}
    assert not bad, f"{profile}: relative L2 past tolerance {bad} (all: {worst})"
