"""colibri_bench's ggml peer (colibri_bench/peers/): what the bench does with a peer that
runs its own weight format, what the harness refuses, and, where a ggml checkout is named
by COLIBRI_GGML_SRC, the harness built against it computing the layer (not speed)."""
import os
from pathlib import Path

import numpy as np
import pytest

from colibri_bench import bench
from colibri_bench.peers import ggml
from tuner.measure import problems


class FakePeer:
    """A peer that times its own calls, as GgmlLayer does."""

    def __init__(self, t):
        self.t, self.calls = t, []

    def seconds(self, xs, threads, min_seconds):
        self.calls.append(threads)
        return self.t


def test_a_peer_that_times_itself_is_asked_in_every_round(monkeypatch):
    monkeypatch.setattr(bench, "time_colibri", lambda layers, xs, th, s: 1.0)
    peer = FakePeer(2.0)
    per, bws = {}, []
    bench.time_rounds({"colibri-default": "d"}, {"ggml": peer}, None, 2, 3, 0.1, lambda th: 10.0, per, bws)
    assert per == {"colibri-default": [1.0] * 3, "ggml": [2.0] * 3}
    assert peer.calls == [2, 2, 2] and bws == [10.0] * 3


def test_a_peer_in_its_own_format_counts_its_own_bytes_against_the_dtypes_roof():
    p = problems.problem("h256-i256-e8-k2-norm/decode/int4g32")
    p32 = problems.problem("h256-i256-e8-k2-norm/decode/f32")
    own_bytes = p.decode_bytes * 9 // 10  # a format 10% smaller than Colibri's
    ts = {"colibri-default": [1e-4] * 4, "ggml": [2e-4] * 4}
    bws = [20.0] * 4
    rows = {r["impl"]: r for r in bench.group_rows(
        p, p32, ts, bws, 2, {"colibri-default": 1}, reached=p.k,
        own={"ggml": {"weights": "q4_0", "decode_bytes": own_bytes}})}
    g, c = rows["ggml"], rows["colibri-default"]
    assert g["weights"] == "q4_0" and c["weights"] == "int4g32"
    assert g["gbps"] == pytest.approx(own_bytes / 2e-4 / 1e9)
    assert g["pct_of_read_bw"] == pytest.approx(100 * own_bytes / 2e-4 / 1e9 / 20.0)
    # the same roof as Colibri's row of the dtype: % roof compares the two speeds directly
    assert g["roof_ms_per_token"] == pytest.approx(c["roof_ms_per_token"])
    assert g["pct_of_roof"] == pytest.approx(c["pct_of_roof"] / 2)
    assert c["vs_ggml"] == pytest.approx(2.0) and g["vs_ggml"] is None
    # a peer on the f32 weights (NumPy) keeps the f32 problem's bytes
    rows = {r["impl"]: r for r in bench.group_rows(p, p32, dict(ts, numpy=[3e-4] * 4), bws, 2,
                                                   {"colibri-default": 1}, reached=p.k)}
    assert rows["numpy"]["weights"] == "f32"
    assert rows["numpy"]["gbps"] == pytest.approx(p32.decode_bytes / 3e-4 / 1e9)


def test_the_harness_says_what_it_cannot_build(tmp_path):
    # a shared expert, softmax over the top-k logits, rows not whole blocks of the type
    assert "shared expert" in ggml.unsupported(problems.problem("tiny/decode/int8"), "int8")
    assert "shared expert" in ggml.unsupported(problems.problem("h256-i256-e8-k2-topk/decode/f32"), "f32")
    assert "blocks of 256" in ggml.unsupported(problems.problem("h2048-i1408-e8-k2/decode/int4"), "int4")
    assert ggml.unsupported(problems.problem("h2048-i1408-e8-k2/decode/int4g32"), "int4g32") is None
    assert ggml.unsupported(problems.problem("qwen3-30b-a3b/decode/int4"), "int4") is None
    with pytest.raises(ggml.GgmlError, match="no ggml checkout"):
        ggml.source_dir(tmp_path)
    # a llama.cpp clone: its ggml/ folder
    (tmp_path / "ggml" / "include").mkdir(parents=True)
    (tmp_path / "ggml" / "include" / "ggml.h").write_text("")
    (tmp_path / "ggml" / "CMakeLists.txt").write_text("")
    assert ggml.source_dir(tmp_path) == (tmp_path / "ggml").resolve()


def test_a_cell_the_harness_cannot_build_is_skipped_with_its_reason():
    info, said = {"cells": []}, []
    p32 = problems.problem("tiny/decode/f32")
    assert bench.ggml_peer(Path("unused.so"), p32, {}, "int8", 1, None, None, 1, info, said.append) is None
    assert info["cells"] == [{"case": "tiny/decode/int8",
                              "skipped": "the harness builds softmax-routed layers without a shared expert"}]
    assert "ggml not run on tiny/decode/int8" in said[0]


SRC = os.environ.get("COLIBRI_GGML_SRC")


@pytest.mark.skipif(not SRC, reason="set COLIBRI_GGML_SRC to a ggml or llama.cpp checkout to build "
                                    "the harness against it (minutes; CI has none)")
@pytest.mark.parametrize("phase", ["decode", "prefill16"])
def test_the_harness_computes_the_layer(tmp_path, phase):
    from colibri_bench.bench import numpy_layer

    so, commit = ggml.build(SRC, Path(os.environ.get("COLIBRI_GGML_BUILD", tmp_path)), say=lambda m: None)
    p = problems.problem(f"h256-i256-e8-k2-norm/{phase}/f32")
    rng = np.random.default_rng(0)
    w = {"router": rng.standard_normal((p.E, p.H), np.float32),
         "gate": rng.standard_normal((p.E, p.I, p.H), np.float32) / 16,
         "up": rng.standard_normal((p.E, p.I, p.H), np.float32) / 16,
         "down": rng.standard_normal((p.E, p.H, p.I), np.float32) / 16}
    x = rng.standard_normal((p.T, p.H), np.float32)
    ref = numpy_layer(x, w, p)
    # the layer error each ggml type gives on these weights (a wrong layout gives ~1.4)
    bound = {"f32": 1e-5, "bf16": 0.02, "int8": 0.03, "int4g32": 0.3, "int4": 0.3}
    for dtype, limit in bound.items():
        layer = ggml.GgmlLayer(so, p, w, dtype, copies=2)
        y = layer.forward(x, 2)
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < limit, dtype
        assert layer.seconds(np.stack([x, x]), 1, 0.01) > 0
        assert layer.decode_bytes > p.E * p.H * 4
