"""Build and run the model-loader fuzzer (fuzz/fuzz_model_file.c); `scripts/fuzz` calls this.

    scripts/fuzz --seconds 600 [--jobs 2]    fuzz for 10 minutes, print the figures
    scripts/fuzz --replay                    run the seed and regression corpora once
    scripts/fuzz --minimize CRASH --name N   shrink a crashing input into corpus/regress/N

The build is `scons profile=fuzz cc=clang` (profiles/fuzz.yaml: clang, libFuzzer,
AddressSanitizer, UBSan). A run starts from the seed corpus, the regression corpus
and the working corpus kept under <build_dir>/fuzz-corpus/ (so successive runs go
on where the last stopped); crashing, hanging or out-of-memory inputs are written to
<build_dir>/fuzz-artifacts/ and make the command fail. Each one found belongs in
fuzz/corpus/regress/ (minimised, --minimize) once the bug is fixed: the test suite
replays that directory.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUZZ_DIR = ROOT / "fuzz"
SEED_DIR = FUZZ_DIR / "corpus" / "seed"
REGRESS_DIR = FUZZ_DIR / "corpus" / "regress"
DICT = FUZZ_DIR / "model_file.dict"
TARGET = "fuzz_model_file"
PROFILE = "fuzz"

# Per-input limits: an input that runs longer, or makes the process grow past this,
# is a bug report (a hang or a memory blow-up), not a slow test.
TIMEOUT_S = 10
RSS_LIMIT_MB = 2048
MAX_LEN = 65536  # the seeds are a few KB; room for mutants that grow tables

# What a sanitizer or libFuzzer prints when something went wrong.
FAILURE_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "ERROR: libFuzzer", "==ERROR", "SUMMARY: UndefinedBehaviorSanitizer",
                   "invariant failed", "ALARM: working on the last Unit")


class FuzzError(RuntimeError):
    """The fuzzer cannot be built or run here."""


def build_dir() -> Path:
    return Path(os.environ.get("COLIBRI_BUILD_DIR", ROOT / "build"))


def binary_path() -> Path:
    return build_dir() / PROFILE / TARGET


def toolchain_problem() -> str | None:
    """Why the fuzzer cannot be built here (clang or its libFuzzer runtime missing), or None."""
    clang = shutil.which("clang")
    if clang is None:
        return "clang is not installed (Debian: apt-get install clang libclang-rt-14-dev, " \
               "or scripts/setup --test)"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("#include <stddef.h>\n#include <stdint.h>\n"
                       "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)"
                       " { (void)d; (void)n; return 0; }\n")
        res = subprocess.run([clang, "-fsanitize=fuzzer,address,undefined", str(src), "-o",
                              str(Path(tmp) / "probe")], capture_output=True, text=True)
        if res.returncode != 0:
            return ("clang cannot link a libFuzzer target (is the runtime installed? Debian: "
                    "apt-get install libclang-rt-14-dev): " + res.stderr.strip()[-300:])
    return None


def build(quiet: bool = True) -> Path:
    """`scons profile=fuzz cc=clang`; returns the fuzzer binary."""
    cmd = [sys.executable, "-m", "SCons", "-Q", f"profile={PROFILE}", "cc=clang",
           f"build_dir={build_dir()}"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise FuzzError(f"building the fuzzer failed ({' '.join(cmd[2:])}, exit "
                        f"{res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    if not quiet:
        print(res.stdout, end="")
    if not binary_path().exists():
        raise FuzzError(f"the build did not produce {binary_path()}")
    return binary_path()


@dataclass
class Stats:
    executions: int = 0
    coverage: int = 0        # edges (libFuzzer "cov")
    features: int = 0        # libFuzzer "ft": edges plus counters and value profiles
    corpus_units: int = 0    # libFuzzer "corp": inputs it keeps
    corpus_bytes: str = ""
    exec_per_s: int = 0


_STAT = re.compile(r"^#(\d+)\s+\S+\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)(?:.*exec/s: (\d+))?")
_FORK_STAT = re.compile(r"^#(\d+): cov: (\d+) ft: (\d+) corp: (\d+) exec/s:? (\d+)")
_EXECUTED = re.compile(r"^stat::number_of_executed_units: (\d+)")


def parse_stats(output: str) -> Stats:
    """The last progress line of a libFuzzer log (plain or -fork mode), plus the
    final executed-units count when -print_final_stats printed it."""
    st = Stats()
    for line in output.splitlines():
        m = _STAT.match(line)
        if m:
            st.executions, st.coverage, st.features, st.corpus_units = map(int, m.group(1, 2, 3, 4))
            st.corpus_bytes = m.group(5)
            if m.group(6):
                st.exec_per_s = int(m.group(6))
            continue
        m = _FORK_STAT.match(line)
        if m:
            st.executions, st.coverage, st.features, st.corpus_units, st.exec_per_s = \
                map(int, m.groups())
            continue
        m = _EXECUTED.match(line)
        if m:
            st.executions = int(m.group(1))
    return st


def failures_in(output: str) -> list[str]:
    return [line for line in output.splitlines() if any(k in line for k in FAILURE_MARKERS)]


@dataclass
class RunResult:
    returncode: int
    output: str
    stats: Stats
    artifacts: list[Path]
    seconds: float
    corpus_files: int

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.artifacts and not failures_in(self.output)


def _fresh(cmd: list[str]) -> list[str]:
    """cmd started by a shell that forks it: libFuzzer's -rss_limit_mb reads the peak RSS
    (ru_maxrss), which Linux carries over from the process that forks and execs the fuzzer.
    Run from a pytest process holding 2.3 GB, a fresh fuzzer read 2295 MB at its first check
    and stopped as out of memory; the shell's own child starts from the shell's few MB."""
    return ["/bin/sh", "-c", '"$@"; exit $?', "sh", *cmd]


def _common_flags(artifacts: Path) -> list[str]:
    flags = [f"-timeout={TIMEOUT_S}", f"-rss_limit_mb={RSS_LIMIT_MB}", f"-max_len={MAX_LEN}",
             f"-artifact_prefix={artifacts}/", "-print_final_stats=1"]
    if DICT.exists():
        flags.append(f"-dict={DICT}")
    return flags


def run(binary: Path, seconds: int, *, jobs: int = 1, corpus: Path | None = None,
        artifacts: Path | None = None, extra: list[str] | None = None) -> RunResult:
    """Fuzz for `seconds` from seed + regress + the working corpus (new inputs go there)."""
    corpus = corpus or build_dir() / "fuzz-corpus"
    artifacts = artifacts or build_dir() / "fuzz-artifacts"
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    before = set(artifacts.iterdir())
    cmd = [str(binary), f"-max_total_time={seconds}", *_common_flags(artifacts)]
    if jobs > 1:
        # fork mode: J child processes share one corpus and the parent prints merged figures
        cmd.append(f"-fork={jobs}")
    cmd += list(extra or []) + [str(corpus), str(SEED_DIR), str(REGRESS_DIR)]
    t0 = time.monotonic()
    # the time limit is libFuzzer's; the margin covers start-up, merge and a last slow input
    res = subprocess.run(_fresh(cmd), capture_output=True, text=True, errors="replace",
                         timeout=seconds + 120 + TIMEOUT_S)
    elapsed = time.monotonic() - t0
    output = res.stdout + res.stderr
    new = sorted(set(artifacts.iterdir()) - before)
    return RunResult(res.returncode, output, parse_stats(output), new, elapsed,
                     sum(1 for p in corpus.iterdir() if p.is_file()))


def replay(binary: Path, dirs: list[Path] | None = None) -> RunResult:
    """Runs every input of `dirs` (default: seed and regress) once; no mutation."""
    dirs = dirs or [SEED_DIR, REGRESS_DIR]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(binary), "-runs=0", *_common_flags(Path(tmp)), *map(str, dirs)]
        t0 = time.monotonic()
        res = subprocess.run(_fresh(cmd), capture_output=True, text=True, errors="replace", timeout=600)
        arts = sorted(Path(tmp).iterdir())
        output = res.stdout + res.stderr
        n = sum(1 for d in dirs for p in d.iterdir() if p.is_file())
        return RunResult(res.returncode, output, parse_stats(output), arts,
                         time.monotonic() - t0, n)


def minimize(binary: Path, crash: Path, name: str, seconds: int = 60) -> Path:
    """Shrinks a crashing input with libFuzzer's -minimize_crash into corpus/regress/name."""
    out = REGRESS_DIR / name
    if out.exists():
        raise FuzzError(f"{out} exists; choose another --name")
    with tempfile.TemporaryDirectory() as tmp:  # the intermediate crash-* files go there
        cmd = [str(binary), "-minimize_crash=1", f"-max_total_time={seconds}",
               f"-artifact_prefix={tmp}/", f"-exact_artifact_path={out}", str(crash)]
        subprocess.run(_fresh(cmd), capture_output=True, text=True, timeout=seconds + 120, cwd=tmp)
    if not out.exists():  # nothing smaller still crashes (or it no longer crashes): keep it whole
        shutil.copyfile(crash, out)
    return out


def _report(res: RunResult, what: str) -> None:
    s = res.stats
    print(f"{what}: {s.executions} executions in {res.seconds:.0f} s "
          f"({s.exec_per_s} exec/s at the end), coverage {s.coverage} edges / {s.features} "
          f"features, corpus {s.corpus_units} inputs kept by libFuzzer "
          f"({res.corpus_files} files in the corpus directory)")
    for line in failures_in(res.output)[:20]:
        print(f"  {line}")
    for a in res.artifacts:
        print(f"  crashing/hanging input: {a}\n    fix the bug, then: scripts/fuzz --minimize {a} "
              f"--name <what-it-breaks>.colibri")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/fuzz", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--seconds", type=int, default=600, help="fuzzing time (default 600)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="parallel fuzzing processes (libFuzzer -fork); default 1")
    ap.add_argument("--corpus", type=Path, default=None,
                    help="working corpus directory (default <build_dir>/fuzz-corpus)")
    ap.add_argument("--replay", action="store_true",
                    help="only run the seed and regression corpora once")
    ap.add_argument("--minimize", type=Path, metavar="CRASH",
                    help="shrink a crashing input into fuzz/corpus/regress/ (with --name)")
    ap.add_argument("--name", help="file name for --minimize")
    ap.add_argument("--no-build", action="store_true", help="use the binary already built")
    args = ap.parse_args(argv)
    if args.seconds < 1 or args.jobs < 1:
        ap.error("--seconds and --jobs must be >= 1")
    if args.minimize and not args.name:
        ap.error("--minimize needs --name")
    problem = toolchain_problem()
    if problem:
        print(f"scripts/fuzz: cannot fuzz here: {problem}", file=sys.stderr)
        return 2
    try:
        binary = binary_path() if args.no_build else build()
        if args.minimize:
            print(f"written {minimize(binary, args.minimize, args.name)}")
            return 0
        if args.replay:
            res = replay(binary)
            _report(res, f"replay of {res.corpus_files} seed and regression inputs")
        else:
            res = run(binary, args.seconds, jobs=args.jobs, corpus=args.corpus)
            _report(res, f"fuzzing {args.seconds} s with {args.jobs} job(s)")
    except (FuzzError, subprocess.TimeoutExpired) as exc:
        print(f"scripts/fuzz: {exc}", file=sys.stderr)
        return 2
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
