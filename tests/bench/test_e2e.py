"""python -m colibri_bench e2e on its tiny shape: the tables, the JSON, and figures from real
runs (what it measures is checked, not how fast: speed is for the full-size command)."""
import json
import subprocess
import sys

import pytest

from colibri_bench import e2e

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_e2e_writes_patched_against_unpatched_figures(tmp_path):
    out = tmp_path / "e2e.json"
    res = subprocess.run([sys.executable, "-m", "colibri_bench", "e2e", "--shape", "tiny", "--layers", "2",
                          "--variant", "moe:bf16", "--variant", "all:int4g32", "--rounds", "2",
                          "--prompt-tokens", "12", "--new-tokens", "3", "--prefill-repeats", "2", "--handoff", "off",
                          "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"moe:bf16", "all:int4g32"}
    for wdt, r in data["results"].items():
        assert r["modules"] == (2 if wdt == "moe:bf16" else 2 + 4 * 2 + 1)
        # every call on Colibri (--handoff off): the byte counts below are its modules'
        assert r["handoff"] is None and len(r["handoffs"]) == r["modules"]
        assert set(r["handoffs"].values()) == {None}
        assert len(r["rounds"]["unpatched"]) == len(r["rounds"]["patched"]) == 2
        for side in ("unpatched", "patched"):
            row = r[side]
            assert row["decode_tok_s"] > 0 and row["prefill_tok_s"] > 0
            # the hooks saw the MoE blocks: time inside them, less than the whole step
            assert 0 < row["moe_decode_ms_per_token"] < row["decode_ms_per_token"]
            assert 0 < row["moe_prefill_s"] < row["prefill_s"]
        for side in ("unpatched", "patched"):
            # each round's prefill: the median of --prefill-repeats samples, kept beside it
            for row in r["rounds"][side]:
                for key in ("prefill", "moe_prefill"):
                    got = row[f"{key}_samples_s"]
                    assert len(got) == 2 and min(got) <= row[f"{key}_s"] <= max(got)
                    assert row[f"{key}_s"] == pytest.approx(sum(got) / 2)
                assert row["prefill_tok_s"] == pytest.approx(12 / row["prefill_s"])
            # and the other parts Colibri can replace, patched or not; together less than a step
            parts = [row[f"{p}_decode_ms_per_token"] for p in ("moe", "attn_proj", "lm_head")]
            assert min(parts) > 0 and sum(parts) < row["decode_ms_per_token"]
        for k in ("decode", "prefill", "moe_decode", "moe_prefill"):
            s = r["speedup"][k]
            assert s["min"] <= s["median"] <= s["max"]
        # each part's decode bytes: the tiny shape's tensors, counted by hand (2 layers, bf16
        # unpatched: a block reads its router and top_k of its experts)
        c = e2e.SHAPES["tiny"][1]
        H, I, E, k, hd = (c[n] for n in ("hidden_size", "moe_intermediate_size", "num_experts",
                                         "num_experts_per_tok", "head_dim"))
        proj = 2 * c["num_attention_heads"] * hd * H + 2 * c["num_key_value_heads"] * hd * H
        bw = r["decode_bandwidth"]
        assert bw["unpatched"]["moe"]["bytes"] == 2 * (E * H * 2 + k * 3 * I * H * 2)
        assert bw["unpatched"]["attn_proj"]["bytes"] == 2 * proj * 2
        assert bw["unpatched"]["lm_head"]["bytes"] == c["vocab_size"] * H * 2
        if wdt == "moe:bf16":  # Colibri's router is f32; the projections stay torch's
            assert bw["patched"]["moe"]["bytes"] == 2 * (E * H * 4 + k * 3 * I * H * 2)
            assert bw["patched"]["attn_proj"]["bytes"] == bw["unpatched"]["attn_proj"]["bytes"]
        else:
            assert 0 < bw["patched"]["lm_head"]["bytes"] < bw["unpatched"]["lm_head"]["bytes"]
        assert r["read_bw_gbps"] > 0
        # a reading right before and right after each patched run, and after its blocks alone
        assert [len(x) for x in r["read_bw_around"]["patched"]] == [2, 2]
        assert [a[0] for a in r["read_bw_around"]["alone"]] == [p[1] for p in r["read_bw_around"]["patched"]]
        assert all(x > 0 for v in r["read_bw_around"].values() for p in v for x in p)
        # the patched model's prompt logits against the unpatched model's (seen: 0.0055 for
        # bf16 MoE blocks, 0.22 with everything in int4g32 on this random-init model)
        assert 0 < r["logits_rel_err"] <= (2e-2 if wdt == "moe:bf16" else 0.35), (wdt, r["logits_rel_err"])
        for side in ("unpatched", "patched"):
            for p in ("moe", "attn_proj", "lm_head"):
                cell = bw[side][p]
                ms = r[side][f"{p}_decode_ms_per_token"]
                assert cell["gbps"] == pytest.approx(cell["bytes"] / ms * 1e-6)
                assert cell["pct_bw"] == pytest.approx(100 * cell["gbps"] / r["read_bw_gbps"])
                # each round against the better of the readings around it: the unpatched run
                # between the rounds' readings, the patched one between its own
                bws, rows = r["read_bw_rounds"], r["rounds"][side]
                around = list(zip(bws, bws[1:])) if side == "unpatched" else r["read_bw_around"]["patched"]
                want = sorted(100 * cell["bytes"] / (row[f"{p}_decode_ms_per_token"] * 1e-3) / 1e9
                              / max(around[i]) for i, row in enumerate(rows))
                assert cell["pct_bw_paired"] == pytest.approx(want[len(want) // 2] if len(want) % 2 else
                                                              (want[len(want) // 2 - 1] + want[len(want) // 2]) / 2)
        # the patched blocks alone, back to back after each patched run: every round timed, the
        # same bytes as the blocks in the model
        # by their total time and by their median call
        for key in ("moe_alone", "moe_alone_median"):
            alone = bw["patched_moe_alone"][key]
            assert all(row[f"{key}_decode_ms_per_token"] > 0 for row in r["rounds"]["patched"])
            assert alone["bytes"] == bw["patched"]["moe"]["bytes"]
            assert alone["gbps"] == pytest.approx(alone["bytes"] / r["patched"][f"{key}_decode_ms_per_token"] * 1e-6)
            assert f"{key}_decode_ms_per_token" not in r["unpatched"]
        assert f"\n{wdt} " in res.stdout
    assert "decode tok/s" in res.stdout and "MoE ms/token" in res.stdout
    assert "decode ms/token by part" in res.stdout and "lm_head" in res.stdout
    assert "decode GB/s by part" in res.stdout and "MoE blocks alone" in res.stdout


def test_e2e_refuses_too_few_new_tokens():
    res = subprocess.run([sys.executable, "-m", "colibri_bench", "e2e", "--new-tokens", "1"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--new-tokens" in res.stderr
    for bad in ("0", "sometimes"):
        res = subprocess.run([sys.executable, "-m", "colibri_bench", "e2e", "--handoff", bad],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and "--handoff" in res.stderr and "auto, off or a token count" in res.stderr


def test_handoff_summary_counts_modules_by_threshold():
    from colibri import hf

    assert hf.handoff_summary({"a": None}) == "hand-off: none"
    assert hf.handoff_summary({"a": 128, "b": None, "c": 128, "d": 8}) == \
        "hand-off: 1 module(s) from 8 tokens, 2 module(s) from 128 tokens"


def test_part_clock_times_parts_by_phase_and_gives_the_modules_back():
    import torch

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(8, 8)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Module()])
            self.layers[0].self_attn = Attn()
            self.lm_head = torch.nn.Linear(8, 5)

    m = Tiny()
    q, head = m.layers[0].self_attn.q_proj, m.lm_head
    own = head.forward = lambda x: torch.nn.Linear.forward(head, x) * 2  # an instance's own forward
    want = head(torch.ones(1, 1, 8))
    clock = e2e.PartClock(m)
    assert "forward" in q.__dict__ and head.forward is not own
    with torch.no_grad():
        q(torch.ones(1, 3, 8))  # prefill: 3 tokens
        q(torch.ones(1, 1, 8))
        got = head(torch.ones(1, 1, 8))
    assert torch.equal(got, want)  # the wrapped module still computes what it did
    assert clock.prefill["attn_proj"] > 0 and clock.decode["attn_proj"] > 0
    assert clock.decode["lm_head"] > 0 and clock.prefill["lm_head"] == 0 and clock.decode["moe"] == 0
    clock.reset()
    assert set(clock.decode.values()) == {0.0}
    clock.remove()
    assert "forward" not in q.__dict__ and head.forward is own
    q(torch.ones(1, 1, 8))
    assert clock.decode["attn_proj"] == 0  # no longer timed


def test_windows_are_judged_against_the_whole_runs_best_reading():
    """A variant whose rounds all ran in a slow window (readings ~34 GB/s) is fast against its
    own best reading; against the run's best (another variant's 60) its rounds are slow."""
    def variant(reading, ms):
        rows = [{"moe_decode_ms_per_token": m} for m in ms]
        out = {"read_bw_rounds": [reading] * 3, "read_bw_around": {"patched": [[reading, reading]] * 2, "alone": []},
               "rounds": {"unpatched": rows, "patched": rows}}
        cells = {"moe": {"bytes": 30_000_000}}
        out["decode_bandwidth"] = {"unpatched": cells, "patched": {"moe": dict(cells["moe"])}, "patched_moe_alone": None}
        return out

    slow, fast = variant(34.0, [1.0, 1.0]), variant(60.0, [0.6, 0.6])
    own = e2e.round_windows(30_000_000, "moe_decode_ms_per_token", slow["rounds"]["patched"],
                            slow["read_bw_around"]["patched"], None)
    assert own["fast_rounds"] == 2 and own["slow_rounds"] == 0  # against its own best
    e2e.judge_windows({"a": slow, "b": fast})
    for side in ("unpatched", "patched"):
        win = slow["decode_bandwidth"][side]["moe"]["windows"]
        assert win["best_gbps"] == 60.0 and win["fast_rounds"] == 0 and win["slow_rounds"] == 2
        assert win["slow"] == pytest.approx(30.0 / 34.0)  # 30 MB in 1 ms against 34 GB/s
        won = fast["decode_bandwidth"][side]["moe"]["windows"]
        assert won["fast_rounds"] == 2 and won["fast"] == pytest.approx(50.0 / 60.0)
