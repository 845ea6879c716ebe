"""python -m colibri_bench soak: no memory growth over a short run, and a leak would be caught."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_bench import soak

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20


@pytest.fixture
def plain_lib(lib):
    """The library, unless it is a sanitizer build: AddressSanitizer keeps freed memory in a
    quarantine (256 MiB by default), so RSS grows by design there and says nothing of leaks."""
    from colibri._lib import ffi

    if "-fsanitize=address" in ffi.string(lib.colibri_build_info()).decode():
        pytest.skip("RSS growth is meaningless under AddressSanitizer (quarantine)")
    return lib


def test_detect_growth_flat_noise_is_not_a_leak():
    base = 100 * MiB
    noise = [0, 40_000, -20_000, 60_000, 0, 10_000, -30_000, 20_000]
    samples = [(i * 100, base + n) for i, n in enumerate(noise)]
    g = soak.detect_growth(samples, warmup_tokens=100, max_growth_bytes=1 * MiB)
    assert not g["leaked"] and abs(g["growth_bytes"]) < 100_000


def test_detect_growth_steady_growth_is_a_leak():
    samples = [(i * 100, 100 * MiB + i * 300_000) for i in range(12)]
    g = soak.detect_growth(samples, warmup_tokens=200, max_growth_bytes=1 * MiB)
    assert g["leaked"]
    assert g["growth_bytes"] == 7 * 300_000  # sample 2 (200 tokens) to the tail's minimum, sample 9
    assert g["slope_bytes_per_1k_tokens"] == pytest.approx(3_000_000)


def test_detect_growth_ignores_warmup_and_one_spike():
    warm = [(0, 50 * MiB), (100, 80 * MiB)]  # allocators settling: before the baseline
    steady = [(200 + 100 * i, 90 * MiB) for i in range(6)]
    steady[-1] = (steady[-1][0], 95 * MiB)  # one sample caught mid-allocation
    g = soak.detect_growth(warm + steady, warmup_tokens=200, max_growth_bytes=1 * MiB)
    assert not g["leaked"] and g["growth_bytes"] == 0


def test_detect_growth_needs_samples_after_warmup():
    with pytest.raises(ValueError, match="at least 2 samples"):
        soak.detect_growth([(0, 1), (100, 2)], warmup_tokens=100, max_growth_bytes=1)


def test_short_soak_does_not_grow(plain_lib):
    rep = soak.soak(tokens=2000, shape="tiny", threads=1, every=100, warmup=400, churn=2,
                    with_model=True, max_growth_mib=2.0)
    assert rep["ok"], soak.print_report(rep) or rep
    assert rep["outputs_stable"] and rep["growth_bytes"] <= 2 * MiB
    assert rep["tokens"] >= 2000 and rep["calls"] > 4
    assert rep["layers_created"] == rep["models_loaded"] == 2 * (len(rep["samples"]) - 1)
    assert len(rep["samples"]) >= 18


def test_a_budgeted_model_soaks_by_the_clock_with_its_cache_turning_over(plain_lib, tmp_path):
    """--minutes and --memory-budget: the model under a budget of a quarter of its experts,
    reloaded under it at every sample; each sample has the model's tokens/s and the cache's
    traffic, and the report the growth per hour and as a share of the baseline."""
    rep = soak.soak(minutes=0.08, shape="tiny", threads=1, churn=1, with_model=True, budget_share=0.25,
                    max_growth_mib=2.0)
    assert rep["ok"], soak.print_report(rep) or rep
    assert rep["memory_budget"] > 0 and rep["minutes"] == 0.08 and rep["every"] is None
    # a sample every 1/40 of the time where the calls allow it (a loaded machine takes fewer)
    assert 3 <= len(rep["samples"]) <= 42 and rep["samples"][-1]["seconds"] >= 4.8
    assert 0 < rep["warmup_tokens"] < rep["tokens"]
    late = rep["samples"][-1]
    assert late["model_tokens_per_s"] > 0
    assert late["cache"]["misses"] > 0 and late["cache"]["evictions"] > 0  # it turned over
    assert abs(rep["growth_share"]) < 0.05 and "growth_bytes_per_hour" in rep
    with pytest.raises(ValueError, match="needs a model"):
        soak.soak(tokens=10, budget_share=0.5)
    with pytest.raises(ValueError, match="tokens or minutes"):
        soak.soak(tokens=10, minutes=1)


def test_a_leaking_loop_is_caught(lib):
    """The same run plus 128 KiB kept per call (~8 MiB after warm-up): it must be flagged."""
    kept = []
    rep = soak.soak(tokens=1500, shape="tiny", threads=1, every=100, warmup=300,
                    max_growth_mib=2.0, step_hook=lambda: kept.append(b"\x01" * 131072))
    assert rep["leaked"] and not rep["ok"]
    # RSS may not move (the leak can reuse pages the process already holds); malloc's
    # bytes in use do
    assert max(rep["growth_bytes"], rep.get("heap_growth_bytes", 0)) > 2 * MiB
    assert max(rep["slope_bytes_per_1k_tokens"], rep.get("heap_slope_bytes_per_1k_tokens", 0)) > 0


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "colibri_bench", "soak", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_cli_json_and_table(plain_lib):
    r = _cli("--tokens", "800", "--every", "80", "--threads", "1", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["shape"] == "tiny" and rep["tokens"] >= 800
    assert {"tokens", "rss_bytes", "layers_created"} <= set(rep["samples"][0])
    r = _cli("--tokens", "300", "--every", "60", "--threads", "1", "--dtype", "int8")
    assert r.returncode == 0, r.stderr
    assert "growth after warm-up" in r.stdout and "RSS MiB" in r.stdout


@pytest.mark.parametrize("args", [["--tokens", "0"], ["--tokens", "100", "--shape", "nope"],
                                  ["--tokens", "100", "--warmup", "100"], [],
                                  ["--tokens", "100", "--model", "m", "--with-model"]])
def test_cli_usage_errors(args):
    r = _cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)


def test_cli_broken_model_file_is_an_error(tmp_path):
    bad = tmp_path / "bad.colibri"
    bad.write_bytes(b"\x00" * 200)
    r = _cli("--tokens", "100", "--model", str(bad), "--threads", "1")
    assert r.returncode == 1 and "colibri_bench soak:" in r.stderr and "Traceback" not in r.stderr
