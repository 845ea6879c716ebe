"""tuner.host.peak and kernels/peak.c: structure and sanity, never speed.

Short runs (0.02 s per figure): the kernels build through the same pipeline, run on
each unit this build has, refuse the others with the reason, and feed the roofs."""
from __future__ import annotations

from pathlib import Path

import pytest

from colibri import _lib
from colibri._lib import ffi
from colibri_build import hostid
from tuner.host import peak, probe


def _host_flags() -> set:
    return set(probe.probe(measure_bandwidth=False, detect_compilers=False).isa)


def test_every_unit_has_a_figure_or_a_reason(probe_lib):
    res = peak.measure(threads=(1, 2), lib=probe_lib, min_seconds=0.02)
    assert res["threads"] == [1, 2] and "median" in res["statistic"]
    for kind in peak.KINDS:
        assert (kind in res) != (kind in res["reasons"]), kind
    # the FMA runs on every build (figures only: how fast is the bench's business)
    assert res["f32_fma"]["1"] > 0 and res["f32_fma"]["2"] > 0
    for row in res["runs"]:
        for kind, fig in row.items():
            if kind != "threads":
                assert fig["worst_gops"] <= fig["gops"] <= fig["best_gops"]
                # the figure is the best of the bursts, each burst's median kept
                assert len(fig["burst_gops"]) == peak.BURSTS and fig["gops"] == max(fig["burst_gops"])
                assert fig["passes"] >= 5 and fig["threads_run"] == row["threads"]
                assert fig["instruction"]
    flags = _host_flags()
    # this host's profile enables what the CPU has: each dot runs where the flag is there
    if "avx512_bf16" in flags and hostid.host_profile_name() in ("zen4", "zen5", "sapphirerapids"):
        assert res["bf16_dot"]["1"] > 0 and res["runs"][0]["bf16_dot"]["instruction"] == "vdpbf16ps zmm"
    if "amx_tile" not in flags:
        assert "amx_bf16" in res["reasons"] and "amx_int8" in res["reasons"]
        # the reason as the C side words it, without its "peak: unavailable: " prefix
        assert "AMX" in res["reasons"]["amx_bf16"] and not res["reasons"]["amx_bf16"].startswith("peak")


def test_bursts_must_be_positive(probe_lib):
    with pytest.raises(ValueError, match="bursts"):
        peak.measure(threads=(1,), lib=probe_lib, min_seconds=0.01, bursts=0)


def test_bad_arguments_are_errors_not_crashes(probe_lib):
    out = ffi.new("colibri_peak_result *")
    assert probe_lib.colibri_peak_run(9, 1, 0.01, out) != 0
    assert "kind 9" in _lib.last_error(probe_lib)
    assert probe_lib.colibri_peak_run(0, -1, 0.01, out) != 0
    assert probe_lib.colibri_peak_run(0, 1, -1.0, out) != 0
    assert probe_lib.colibri_peak_run(0, 1, 0.01, ffi.NULL) != 0


def test_roof_takes_the_fastest_unit_that_computes_the_dtype():
    peaks = {"f32_fma": {"2": 500.0}, "bf16_dot": {"2": 1000.0}, "int8_dot": {"2": 1050.0},
             "amx_bf16": {"2": 1200.0}}
    assert peak.roof_gops(peaks, "f32", 2) == (500.0, "f32_fma")       # 1200 / 3 < 500
    assert peak.roof_gops(peaks, "bf16", 2) == (600.0, "amx_bf16 x 0.5")  # activations split in two
    assert peak.roof_gops(peaks, "int4g32", 2) == (1050.0, "int8_dot")
    assert peak.roof_gops({**peaks, "amx_bf16": {"2": 3000.0}}, "f32", 2) == (1000.0, "amx_bf16 x 0.333")
    assert peak.roof_gops({"f32_fma": {"2": 500.0}, "bf16_dot": {"2": 1000.0}}, "bf16", 2) == (500.0, "f32_fma")
    assert peak.roof_gops(peaks, "f32", 1) is None                      # not measured there


def test_probe_carries_the_peaks_or_says_why_not():
    info = probe.probe(measure_bandwidth=False, detect_compilers=False)
    assert info.compute is None and info.compute_reason == "not measured (--no-compute)"
    rec = probe.probe(root=Path(__file__).parents[1] / "fixtures/hosts/genoa-2s", measure_bandwidth=True,
                      detect_compilers=False)
    assert rec.compute is None and "recorded tree" in rec.compute_reason
    assert "compute       not measured" in probe.format_text(rec)
