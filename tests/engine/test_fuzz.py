"""The model-loader fuzzer (fuzz/): corpora, replay, and a bounded fuzz session.

The replay runs every seed and every regression input (each one crashed the engine
once) through the libFuzzer target built with AddressSanitizer and UBSan; the session
fuzzes for COLIBRI_FUZZ_SECONDS (default 30) and fails on any crash, hang, leak of
memory past the limit, sanitizer report or broken invariant. Both skip, saying why,
where clang or its libFuzzer runtime is missing.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "fuzz"))

import driver  # noqa: E402  (fuzz/driver.py, what scripts/fuzz runs)
import make_seeds  # noqa: E402

FUZZ_SECONDS = int(os.environ.get("COLIBRI_FUZZ_SECONDS", "30"))


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory):
    problem = driver.toolchain_problem()
    if problem:
        pytest.skip(f"no libFuzzer toolchain: {problem}")
    return driver.build()


# ------------------------------------------------------------------ corpora (no clang needed)

def test_seed_corpus_is_what_the_generator_writes(tmp_path):
    """The committed seeds are exactly make_seeds.py's output: a change to the writer
    or the format must regenerate them (python fuzz/make_seeds.py)."""
    made = {p.name: p.read_bytes() for p in make_seeds.write(tmp_path)}
    committed = {p.name: p.read_bytes() for p in driver.SEED_DIR.iterdir()}
    assert made.keys() == committed.keys()
    stale = sorted(n for n in made if made[n] != committed[n])
    assert not stale, f"seeds out of date (run python fuzz/make_seeds.py): {stale}"


def test_seeds_are_small_valid_models_covering_the_format(lib):
    from colibri.model import Model
    from colibri.modelfile import read_header

    seen = set()
    for path in sorted(driver.SEED_DIR.iterdir()):
        assert path.stat().st_size <= 16384, f"{path.name} is too big for a seed"
        h = read_header(path)
        seen.add(("dtype", h["weight_dtype"]))
        seen.add(("shared", h["shared_inter"] > 0, h["shared_gated"]))
        seen.add(("dynamic", h["dyn_p"] > 0))
        seen.add(("layers>1", h["n_layers"] > 1))
        per_layer = 1 + 3 * h["n_experts"] + 3 * (h["shared_inter"] > 0) + h["shared_gated"]
        seen.add(("shared tensors", h["n_tensors"] < h["n_layers"] * per_layer))
        m = Model.load(path)  # loads: CRCs, shapes and routing all valid
        y = m(np.ones((2, h["hidden"]), np.float32))
        assert y.shape == (2, h["hidden"]) and np.isfinite(y).all()
    for want in [("dtype", 0), ("dtype", 1), ("dtype", 2), ("dtype", 3), ("shared", True, 1),
                 ("shared", True, 0), ("shared", False, 0), ("dynamic", True),
                 ("layers>1", True), ("shared tensors", True)]:
        assert want in seen, f"no seed has {want}"


def test_regression_inputs_exist_and_are_files():
    files = sorted(p for p in driver.REGRESS_DIR.iterdir() if p.is_file())
    assert files, "fuzz/corpus/regress/ is empty"
    assert all(p.stat().st_size > 0 for p in files)


def test_corpora_through_the_binding(lib):
    """Every seed and regression input through colibri.Model (the gcc build, or the
    ASan build under scripts/sanitize, which runs this test too): it loads and runs
    over 1 and 8 tokens, or is refused with ModelFormatError, never a crash. This
    replays the regression corpus where clang is missing."""
    from colibri.model import Model, ModelFormatError

    loaded = 0
    for path in sorted([*driver.SEED_DIR.iterdir(), *driver.REGRESS_DIR.iterdir()]):
        try:
            m = Model.load(path)
        except ModelFormatError as exc:
            assert str(exc), path.name
            continue
        loaded += 1
        H = m.hidden
        for T in (1, 8):
            x = (np.arange(T * H, dtype=np.float32).reshape(T, H) % 11 - 5) * 0.25
            assert m(x).shape == (T, H)
    assert loaded >= len(list(driver.SEED_DIR.iterdir()))


def test_parse_stats_plain_and_fork_output():
    plain = ("#2\tINITED cov: 379 ft: 824 corp: 11/33Kb exec/s: 0 rss: 32Mb\n"
             "#290830\tDONE   cov: 491 ft: 1220 corp: 129/243Kb lim: 9131 exec/s: 6322 rss: 369Mb\n"
             "stat::number_of_executed_units: 290831\n")
    s = driver.parse_stats(plain)
    assert (s.executions, s.coverage, s.features, s.corpus_units, s.corpus_bytes, s.exec_per_s) \
        == (290831, 491, 1220, 129, "243Kb", 6322)
    fork = ("#51234: cov: 612 ft: 1800 corp: 200 exec/s 5000 oom/timeout/crash: 0/0/0 "
            "time: 9s job: 4 dft_time: 0\n")
    s = driver.parse_stats(fork)
    assert (s.executions, s.coverage, s.corpus_units, s.exec_per_s) == (51234, 612, 200, 5000)
    assert driver.failures_in("x\nkernels/layer.c:205:52: runtime error: member access\n")
    assert not driver.failures_in(plain)


# ------------------------------------------------------------------ the fuzzer

def test_replay_seed_and_regression_corpora(fuzzer):
    res = driver.replay(fuzzer)
    assert res.ok, f"replay failed (exit {res.returncode}):\n{res.output[-4000:]}"
    assert res.stats.executions >= res.corpus_files  # every input ran
    assert res.stats.coverage > 100  # the replay reached past the header checks


def test_a_crash_is_reported_with_its_input(fuzzer, tmp_path, monkeypatch):
    """The plumbing is not vacuous: with COLIBRI_FUZZ_SELFTEST_CRASH set the target
    aborts on its first input, and the session must fail and keep that input."""
    monkeypatch.setenv("COLIBRI_FUZZ_SELFTEST_CRASH", "1")
    res = driver.run(fuzzer, 5, corpus=tmp_path / "corpus", artifacts=tmp_path / "artifacts")
    assert not res.ok and res.returncode != 0
    assert [a.name[:6] for a in res.artifacts] == ["crash-"]
    assert any("self-test crash" in line for line in driver.failures_in(res.output))
    rep = driver.replay(fuzzer, [driver.SEED_DIR])
    assert not rep.ok


def test_short_fuzz_session(fuzzer, tmp_path):
    res = driver.run(fuzzer, FUZZ_SECONDS, corpus=tmp_path / "corpus",
                     artifacts=tmp_path / "artifacts")
    print(f"\nfuzz {FUZZ_SECONDS} s: {res.stats.executions} executions, coverage "
          f"{res.stats.coverage} edges, corpus {res.stats.corpus_units} inputs "
          f"({res.corpus_files} new files)")
    crashes = [a.name for a in res.artifacts]
    assert res.ok, (f"the fuzzer found a problem (exit {res.returncode}), inputs {crashes}:\n"
                    f"{res.output[-6000:]}")
    assert res.stats.executions > 100 * FUZZ_SECONDS // 10, "the fuzzer barely ran"


def test_the_callers_memory_does_not_count_against_the_fuzzers_limit(fuzzer, tmp_path):
    """libFuzzer's -rss_limit_mb reads the peak RSS, which Linux carries over from the process
    that forks and execs it: started straight from a pytest process holding 2.3 GB, a fresh
    fuzzer stopped at once as out of memory (twice in full CI runs). The driver starts it
    from a shell's child. Here the caller holds more than the limit while a short session
    runs."""
    import numpy as np

    big = np.ones((driver.RSS_LIMIT_MB + 256) << 17)  # 8-byte floats, every page touched
    res = driver.run(fuzzer, 2, corpus=tmp_path / "corpus", artifacts=tmp_path / "artifacts")
    assert big[-1] == 1.0
    assert res.ok, res.output[-3000:]
