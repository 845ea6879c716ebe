"""tuner.host.bandwidth and kernels/membw.c: structure and sanity, never speed.

Tiny runs (64 MiB, 0.05 s per figure): this checks that the kernels build through
the same pipeline, run, verify themselves and report sensible, positive figures.
"""
from __future__ import annotations

import pytest

from colibri import _lib
from tuner.host import bandwidth, probe

MiB = 1 << 20


def test_measure_tiny(probe_lib):
    res = bandwidth.measure(threads=(1, 2), lib=probe_lib, min_seconds=0.05, bytes=64 * MiB,
                            llc_bytes=8 * MiB)
    assert res["threads"] == [1, 2] and res["bytes"] == 64 * MiB
    assert res["llc_bytes"] == 8 * MiB and res["bytes_rule"] == "given by the caller"
    assert "median" in res["statistic"] and "24 bytes" in res["counting"]["triad"]
    for kind in ("read", "triad"):
        assert set(res[kind]) == {"1", "2"}
        assert all(v > 0 for v in res[kind].values())
        assert res[f"{kind}_gbps"] == max(res[kind].values())
        assert res[f"{kind}_threads"] in (1, 2)
    for row in res["runs"]:
        for kind in ("read", "triad"):
            r = row[kind]
            assert r["passes"] >= 3 and r["seconds_timed"] >= 0.05
            assert r["worst_gbps"] <= r["gbps"] <= r["best_gbps"]
            assert r["threads_run"] == row["threads"]
            assert 0 < r["bytes"] <= 64 * MiB
    assert res["seconds"] > 0


def test_raw_kernel_api(probe_lib):
    ffi = _lib.ffi
    gbps = ffi.new("double *")
    assert probe_lib.colibri_membw(bandwidth.READ, 16 * MiB, 1, 0.0, gbps) == 0
    assert gbps[0] > 0
    out = ffi.new("colibri_membw_result *")
    assert probe_lib.colibri_membw_run(bandwidth.TRIAD, 24 * MiB, 1, 0.0, out) == 0
    assert out.bytes_per_pass == out.bytes and out.passes >= 3 and out.checksum == 2 * 3.5
    # bad arguments are errors with a message, never a crash
    assert probe_lib.colibri_membw_run(7, 16 * MiB, 1, 0.0, out) != 0
    assert "kind" in _lib.last_error(probe_lib)
    assert probe_lib.colibri_membw_run(bandwidth.READ, 16 * MiB, 1, -1.0, out) != 0
    assert probe_lib.colibri_membw_run(bandwidth.READ, 16 * MiB, 1, 0.0, ffi.NULL) != 0


def test_too_small_a_working_set_is_refused(probe_lib):
    with pytest.raises(bandwidth.BandwidthError, match="too small"):
        bandwidth.run_kernel(probe_lib, "triad", 1024, 4, 0.0)


def test_sizing_rules():
    assert bandwidth.thread_ladder(1) == (1,)
    assert bandwidth.thread_ladder(2) == (1, 2)
    assert bandwidth.thread_ladder(12, 6) == (1, 2, 4, 6, 8, 12)
    assert bandwidth.thread_ladder(384, 192)[-3:] == (192, 256, 384)
    assert bandwidth.working_set_bytes(300 * MiB)[0] == 1200 * MiB
    assert bandwidth.working_set_bytes(8 * MiB)[0] == 256 * MiB
    assert bandwidth.working_set_bytes(None)[0] == 256 * MiB
    n, rule = bandwidth.working_set_bytes(1024 * MiB, available=2048 * MiB)
    assert n == 512 * MiB and "capped" in rule


def test_probe_reports_why_bandwidth_is_missing(tmp_path):
    info = probe.probe(lib=tmp_path / "no-such-libcolibri.so", bandwidth_threads=(1,),
                       bandwidth_seconds=0.01, detect_compilers=False)
    assert info.bandwidth is None
    assert "not measured" in info.bandwidth_reason and "LibraryNotFound" in info.bandwidth_reason


def test_resident_copies_cover_the_llc_several_times():
    from tuner.host.bandwidth import LLC_FACTOR, MAX_COPIES, resident_copies
    from tuner.measure.problems import problem

    llc = 300 << 20
    for name in ("qwen3-30b-a3b/decode/int4g32", "qwen3-30b-a3b/decode/bf16",
                 "olmoe-1b-7b/decode/int4g32", "mixtral-8x7b/decode/f32"):
        p = problem(name)
        n = resident_copies(p.layer_bytes, llc)
        assert n * p.layer_bytes >= LLC_FACTOR * llc          # enough copies
        assert n == 1 or (n - 1) * p.layer_bytes < LLC_FACTOR * llc   # and no more
    assert resident_copies(problem("qwen3-30b-a3b/decode/int4g32").layer_bytes, llc) == 4
    assert resident_copies(problem("mixtral-8x7b/decode/f32").layer_bytes, llc) == 1
    assert resident_copies(1000, llc) == MAX_COPIES     # a toy layer: capped
    assert resident_copies(1000, None) == 1             # cache size unknown


def test_resident_copies_cover_the_llc_with_a_shared_expert_too():
    """Every call reads a shared expert again: the copies' shared experts must cover the
    cache several times too, or the bench times them from it (Qwen1.5-MoE int8 decode read
    106-122% of the read bandwidth with one copy of its 554 MB layer on a 32 MiB LLC)."""
    from tuner.host.bandwidth import LLC_FACTOR, MAX_COPY_BYTES, resident_copies
    from tuner.measure.problems import problem

    llc = 32 << 20
    p = problem("qwen1.5-moe-a2.7b/decode/int8")
    assert p.layer_bytes >= LLC_FACTOR * llc and p.reread_bytes < LLC_FACTOR * llc
    assert resident_copies(p.layer_bytes, llc) == 1
    n = resident_copies(p.layer_bytes, llc, p.reread_bytes)
    assert n * p.reread_bytes >= LLC_FACTOR * llc and (n - 1) * p.reread_bytes < LLC_FACTOR * llc
    assert problem("qwen3-30b-a3b/decode/int8").reread_bytes == 0     # no shared expert
    # never more than MAX_COPY_BYTES of copies, one at least
    d = problem("deepseek-v2-lite/decode/f32")
    assert resident_copies(d.layer_bytes, llc, d.reread_bytes) * d.layer_bytes <= max(MAX_COPY_BYTES, d.layer_bytes)
    assert resident_copies(MAX_COPY_BYTES * 2, llc, 1000) == 1


def test_layer_bytes_counts_every_expert_the_shared_expert_and_the_router():
    from colibri.quant import stored_bytes
    from tuner.measure.problems import problem

    p = problem("qwen1.5-moe-a2.7b/decode/int8")
    per_expert = 2 * stored_bytes("int8", p.I, p.H) + stored_bytes("int8", p.H, p.I)
    shared = 2 * stored_bytes("int8", p.S, p.H) + stored_bytes("int8", p.H, p.S)
    assert p.S > 0 and p.layer_bytes == p.E * per_expert + shared + p.E * p.H * 4
    assert p.decode_bytes == p.k * per_expert + shared + p.E * p.H * 4


def test_resident_copies_keep_the_last_calls_experts_out_of_the_cache():
    """Consecutive decode tokens route partly to the same experts: where one call's weights
    fit in the cache a few times over, the calls between two on the same copy must stream
    the cache's size at least (an OLMoE-shaped int4 layer ran 3-17% faster alone than in
    turn with three others on a 32 MiB LLC, its calls' shared experts read from the cache)."""
    from tuner.host.bandwidth import LLC_FACTOR, copies_for, resident_copies
    from tuner.measure.problems import problem

    llc = 32 << 20
    p = problem("olmoe-1b-7b/decode/int4")
    assert p.layer_bytes >= LLC_FACTOR * llc and p.decode_bytes < LLC_FACTOR * llc
    assert resident_copies(p.layer_bytes, llc, p.reread_bytes) == 1  # the layer alone: one copy
    n = copies_for(p, llc)
    assert (n - 1) * p.decode_bytes >= llc and (n - 2) * p.decode_bytes < llc
    assert copies_for(problem("olmoe-1b-7b/prefill512/int4"), llc) == n  # one file for every phase
    # a call that streams the cache several times over leaves little the next one finds
    m = problem("mixtral-8x7b/decode/int4")
    assert m.decode_bytes >= LLC_FACTOR * llc
    assert copies_for(m, llc) == resident_copies(m.layer_bytes, llc, m.reread_bytes)
