"""`python -m tuner verify --profile P`: a profile's library, built here and run where it
can run (under qemu-user for another architecture), checked against the NumPy reference.

1. Builds the profile's library (scons profile=P, with the profile's cross compiler where
   its architecture is not this host's) and kernels/tools/infer_model.c, a program that
   uses only colibri.h, against it.
2. Kernel check: for each case below and each weight dtype, a one-layer model file and
   inputs with a clear routing margin at ragged token counts; the program's output
   (x + moe(x)) minus x against the float64 reference of the same weight format, with the
   tests' tolerances (colibri.reference.compare). The cases cover decode (1-2 tokens)
   and prefill, ragged rows, columns and groups, a gated shared expert, a dynamic expert
   count and softmax_topk scoring.
3. The C API test (tests/c/test_capi.c), where this checkout has it.

Everything runs under emulation when the profile is for another architecture: nothing is
timed. Exit status: 0 every check passed; 1 a check failed or could not run (a missing
tool is named with its package); 2 usage.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from colibri import _cli
from colibri_build import cpuinfo, paths, profiles

DTYPES = ("f32", "bf16", "int8", "int4g32", "int4")
QEMU = {"aarch64": ("qemu-aarch64", "qemu-user", Path("/usr/aarch64-linux-gnu"), "libc6-dev-arm64-cross")}
MARGIN = 1e-3  # the routing margin of the inputs, as the tests draw them
PROGRAM = paths.KERNELS_DIR / "tools" / "infer_model.c"
CAPI_TEST = paths.ROOT / "tests" / "c" / "test_capi.c"


@dataclass(frozen=True)
class Case:
    name: str
    H: int
    I: int
    E: int
    tokens: tuple[int, ...]
    route: dict = field(default_factory=dict)
    shared: int = 0  # the shared expert's inter size (0: none); gated by sigmoid(w . x)


CASES = (
    Case("routed", 67, 45, 8, (1, 2, 7, 40), dict(top_k=3)),
    Case("shared+dynamic-k", 64, 40, 6, (1, 13, 40), dict(top_k=2, dyn_p=0.6, k_min=1, k_max=3), 24),
    Case("softmax_topk", 48, 33, 5, (1, 2, 40), dict(top_k=2, scoring="softmax_topk")),
)


class VerifyError(RuntimeError):
    """A tool is missing, or a build or a run failed."""


@dataclass
class Row:
    case: str
    dtype: str
    tokens: int
    error: float
    ok: bool
    message: str = ""


def _layer(case: Case, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    w = lambda *shape, fan_in: rng.standard_normal(shape, dtype=np.float32) * np.float32(1 / np.sqrt(fan_in))
    H, I, E, S = case.H, case.I, case.E, case.shared
    d = dict(router=w(E, H, fan_in=H) * np.float32(3.0), gate=w(E, I, H, fan_in=H), up=w(E, I, H, fan_in=H),
             down=w(E, H, I, fan_in=I), **case.route)
    if S:
        d.update(shared_gate=w(S, H, fan_in=H), shared_up=w(S, H, fan_in=H), shared_down=w(H, S, fan_in=S),
                 shared_expert_gate=w(H, fan_in=H))
    return d


def _reference(layer: dict, x: np.ndarray, dtype: str) -> np.ndarray:
    from colibri import quant, reference

    rt = lambda a: quant.roundtrip(a, dtype)
    shared = {k: (layer[k] if k == "shared_expert_gate" else rt(layer[k]))
              for k in ("shared_gate", "shared_up", "shared_down", "shared_expert_gate") if k in layer}
    route = {k: layer[k] for k in ("top_k", "scoring", "dyn_p", "k_min", "k_max") if k in layer}
    return reference.moe_layer(x, layer["router"], quant.PerExpert(layer["gate"], dtype),
                               quant.PerExpert(layer["up"], dtype), quant.PerExpert(layer["down"], dtype),
                               **route, **shared, act=quant.ACTIVATION_ROUNDING.get(dtype))


def _run(cmd: list[str], what: str, timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise VerifyError(f"{what}: no answer within {timeout:.0f} s") from None
    if res.returncode != 0:
        raise VerifyError(f"{what}: exit {res.returncode}\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    return res


def _runner(profile: profiles.Profile) -> list[str]:
    """[] on this host's architecture, else the emulator and its sysroot."""
    host = cpuinfo.host_cpu().arch
    if profile.arch in ("any", host):
        return []
    if profile.arch not in QEMU:
        raise VerifyError(f"no emulator known for {profile.arch}")
    exe, package, sysroot, libc = QEMU[profile.arch]
    if shutil.which(exe) is None:
        raise VerifyError(f"{exe} is not installed (Debian: apt-get install {package}; "
                          "`scripts/setup --test` installs it)")
    if not (sysroot / "lib").is_dir():
        raise VerifyError(f"no {profile.arch} C library at {sysroot} (Debian: apt-get install {libc})")
    return [exe, "-L", str(sysroot)]


def _compile(cc: str, source: Path, lib: Path, out: Path, werror: bool = False) -> Path:
    cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", *(["-Werror"] if werror else []),
           f"-I{paths.KERNELS_DIR}", str(source), "-o", str(out), str(lib), f"-Wl,-rpath,{lib.parent}", "-lm"]
    _run(cmd, f"compiling {source.name}")
    return out


def kernel_check(prog: Path, runner: list[str], work: Path, dtypes=DTYPES, cases=CASES) -> list[Row]:
    """The kernel check's rows (see the module's doc)."""
    import colibri
    from colibri import reference

    rows = []
    for n, case in enumerate(cases):
        layer = _layer(case, seed=100 + n)
        for dt in dtypes:
            model = work / f"{case.name}-{dt}.colibri"
            colibri.save_model(model, [layer], weight_dtype=dt)
            for T in case.tokens:
                x = reference.inputs_with_margin(layer["router"], T, seed=T, margin=MARGIN, **case.route)
                xin, yout = work / f"x-{T}.f32", work / "y.f32"
                x.tofile(xin)
                _run([*runner, str(prog), str(model), str(xin), str(T), str(yout)], f"{case.name} {dt} T={T}")
                y = np.fromfile(yout, dtype=np.float32)
                if y.size != x.size:
                    rows.append(Row(case.name, dt, T, float("inf"), False, f"{y.size} values, want {x.size}"))
                    continue
                got = y.reshape(x.shape).astype(np.float64) - x
                ok, err, msg = reference.compare(got, _reference(layer, x, dt), dt)
                rows.append(Row(case.name, dt, T, err, ok, msg))
    return rows


def write_capi_model(path: Path) -> Path:
    """The model file tests/c/test_capi.c expects: 2 layers, hidden 16, inter 8, 4 experts, top 2."""
    import colibri

    rng = np.random.default_rng(3)
    E, I, H = 4, 8, 16
    layer = dict(router=rng.standard_normal((E, H), dtype=np.float32),
                 gate=rng.standard_normal((E, I, H), dtype=np.float32) * 0.1,
                 up=rng.standard_normal((E, I, H), dtype=np.float32) * 0.1,
                 down=rng.standard_normal((E, H, I), dtype=np.float32) * 0.1, top_k=2)
    colibri.save_model(path, [layer, layer])
    return path


def capi_check(cc: str, lib: Path, runner: list[str], work: Path) -> Row:
    """tests/c/test_capi.c built against lib and run (its bad-argument checks)."""
    model = write_capi_model(work / "capi.colibri")
    prog = _compile(cc, CAPI_TEST, lib, work / "test_capi", werror=True)
    scratch = work / "capi-scratch"
    scratch.mkdir(exist_ok=True)
    res = subprocess.run([*runner, str(prog), str(model), str(scratch)], capture_output=True, text=True,
                         timeout=600)
    m = re.search(r"test_capi: (\d+) checks, (\d+) failed", res.stdout)
    if not m:
        return Row("C API test", "-", 0, float("inf"), False, f"no summary (exit {res.returncode})")
    ok = res.returncode == 0 and m.group(2) == "0"
    return Row("C API test", "-", 0, float(m.group(2)), ok, f"{m.group(1)} checks, {m.group(2)} failed")


def verify(profile_name: str, *, build_dir: Path | None = None, config: Path | None = None,
           quiet: bool = True) -> list[Row]:
    """Build the profile's library (with a config.h's knobs where given, else the profile's
    defaults) and run the checks (see the module's doc)."""
    from colibri import _lib

    prof = profiles.get_profile(profile_name)
    runner = _runner(prof)
    try:
        cc = profiles.resolve(prof, "gcc").compiler.path
    except profiles.ResolveError as exc:
        raise VerifyError(str(exc)) from None
    bdir = Path(build_dir) if build_dir else paths.build_dir_default()
    try:
        lib = _lib.build_profile(profile_name, build_dir=bdir, config=config, quiet=quiet)
    except _lib.LibraryNotFound as exc:
        raise VerifyError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="colibri-verify-") as tmp:
        work = Path(tmp)
        prog = _compile(cc, PROGRAM, lib, work / "infer_model")
        rows = kernel_check(prog, runner, work)
        if CAPI_TEST.is_file():
            rows.append(capi_check(cc, lib, runner, work))
    return rows


def print_table(profile: str, rows: list[Row], emulated: bool, out=sys.stdout) -> None:
    print(f"verify {profile}: {'under qemu-user, not timed' if emulated else 'on this host'}", file=out)
    print(f"{'check':18} {'dtype':5} {'tokens':>6} {'error':>9}  result", file=out)
    for r in rows:
        err = f"{r.error:9.2e}" if r.case != "C API test" else f"{'':9}"
        tok = f"{r.tokens:6d}" if r.tokens else f"{'':6}"
        print(f"{r.case:18} {r.dtype:5} {tok} {err}  {'ok' if r.ok else 'FAIL'}"
              f"{'  ' + r.message if r.message and (not r.ok or r.case == 'C API test') else ''}", file=out)
    bad = sum(not r.ok for r in rows)
    print(f"{len(rows) - bad} passed, {bad} failed", file=out)


def add_command(sub) -> None:
    p = sub.add_parser("verify", help="build a profile's library and check it against the NumPy "
                       "reference, under qemu-user for another architecture",
                       description=__doc__.split("\n\n")[0].split(": ", 1)[1].replace("\n", " "),
                       epilog="Exit status: 0 every check passed; 1 a check failed or could not run; "
                       "2 usage.")
    p.add_argument("--profile", required=True, help="the profile to build and check (e.g. neoverse-n1)")
    p.add_argument("--build-dir", help="where the library is built (default build/)")
    p.add_argument("--config", help="a config.h whose knobs the library is built with (a tuner "
                   "artifact's; default: the profile's defaults)")
    p.set_defaults(func=main)


def main(args) -> int:
    known = sorted(profiles.registry())
    if args.profile not in known:
        raise _cli.UsageError(f"unknown profile {args.profile!r} (known: {', '.join(known)})")
    prof = profiles.get_profile(args.profile)
    emulated = prof.arch not in ("any", cpuinfo.host_cpu().arch)
    print(f"tuner verify: building {args.profile} and running "
          f"{sum(len(c.tokens) for c in CASES) * len(DTYPES)} kernel checks"
          f"{' under qemu-user' if emulated else ''}", file=sys.stderr)
    if args.config and not Path(args.config).is_file():
        raise _cli.UsageError(f"--config {args.config}: no such file")
    try:
        rows = verify(args.profile, build_dir=args.build_dir, config=args.config)
    except VerifyError as exc:
        print(f"tuner verify: {exc}", file=sys.stderr)
        return 1
    print_table(args.profile, rows, emulated)
    return 0 if rows and all(r.ok for r in rows) else 1
