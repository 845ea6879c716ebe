"""When a measured speed-up counts (tuner/decide.py) and how a class's winner is chosen from
its interleaved re-timing (tuner/run.py): injected timings, no clock."""
from types import SimpleNamespace

import pytest

from tuner import decide, run


def test_ratio_interval_brackets_the_median_and_is_reproducible():
    r = decide.ratio([1.10, 1.12, 1.09, 1.11, 1.13])
    assert r.lo <= r.median <= r.hi and r.rounds == 5
    assert r == decide.ratio([1.10, 1.12, 1.09, 1.11, 1.13])  # fixed seed: same verdict
    assert r.faster and not r.slower


def test_a_tie_is_neither_faster_nor_slower():
    r = decide.ratio([0.99, 1.01, 1.00, 1.02, 0.985])
    assert not r.faster and not r.slower


def test_slower_by_interval_or_by_median():
    assert decide.ratio([0.990, 0.992, 0.995, 0.991, 0.993]).slower        # interval below 1
    assert decide.ratio([0.97, 1.01, 0.96, 0.975, 0.97]).slower            # median < 0.98
    assert not decide.ratio([0.99, 1.02, 0.985, 1.0, 0.995]).slower


def test_ratio_refuses_no_rounds():
    with pytest.raises(ValueError):
        decide.ratio([])


def _rounds(base: float, factor: float, n: int = 5, wobble: float = 0.003):
    """n rounds of seconds around base*factor, a small deterministic wobble."""
    return [base * factor * (1 + wobble * ((i % 3) - 1)) for i in range(n)]


DEFAULT = {"knob": 0}
CAND = {"knob": 1}
NAMES = ["tiny/decode/f32", "tiny/decode/bf16"]


def _choose(per_lib):
    said = []
    t = SimpleNamespace(say=said.append)
    entries = run.retime_entries([DEFAULT, CAND], per_lib, DEFAULT, NAMES)
    return run._choose(t, "decode", entries), entries, said


def test_a_knob_that_helps_f32_and_hurts_bf16_keeps_the_default():
    # the candidate: 20% faster on f32, 10% slower on bf16 (the geometric mean still wins)
    per_lib = [[_rounds(1.0, 1.0), _rounds(2.0, 1.0)],
               [_rounds(1.0, 0.8), _rounds(2.0, 1.1)]]
    winner, entries, said = _choose(per_lib)
    v = entries[1]["verdict"]
    assert v["overall"]["median"] > 1.0          # faster overall ...
    assert v["slower"] == ["tiny/decode/bf16"]   # ... but slower on bf16
    assert winner["is_default"] and winner["knobs"] == DEFAULT
    assert any("slower on tiny/decode/bf16" in s for s in said)


def test_a_knob_faster_on_every_problem_is_adopted():
    per_lib = [[_rounds(1.0, 1.0), _rounds(2.0, 1.0)],
               [_rounds(1.0, 0.8), _rounds(2.0, 0.9)]]
    winner, entries, _ = _choose(per_lib)
    assert winner["knobs"] == CAND and entries[1]["verdict"]["adopt"]


def test_noise_chooses_nothing():
    # rounds that swing both ways by 3%: no interval above 1, the default stays
    per_lib = [[[1.0, 1.0, 1.0, 1.0, 1.0], [2.0] * 5],
               [[0.97, 1.03, 0.98, 1.02, 0.99], [1.94, 2.06, 1.98, 2.02, 2.0]]]
    winner, _, said = _choose(per_lib)
    assert winner["is_default"]
    assert any("not faster beyond noise" in s for s in said)


def test_split_knobs_let_f32_take_its_value_while_bf16_keeps_its_default():
    # prefetch_f32 and prefetch_bf16 are classes of their own, each on its own dtype:
    # a distance that helps f32 is adopted there, the one that hurts bf16 is not
    f32 = run.retime_entries([{"prefetch_f32": 8192}, {"prefetch_f32": 0}],
                             [[_rounds(1.0, 1.0)], [_rounds(1.0, 0.85)]], {"prefetch_f32": 8192},
                             ["tiny/decode/f32"])
    bf16 = run.retime_entries([{"prefetch_bf16": 8192}, {"prefetch_bf16": 0}],
                              [[_rounds(1.0, 1.0)], [_rounds(1.0, 1.25)]], {"prefetch_bf16": 8192},
                              ["tiny/decode/bf16"])
    t = SimpleNamespace(say=lambda m: None)
    assert run._choose(t, "decode_f32", f32)["knobs"] == {"prefetch_f32": 0}
    assert run._choose(t, "decode_bf16", bf16)["knobs"] == {"prefetch_bf16": 8192}


def test_three_rounds_slightly_below_one_are_not_slower_by_their_interval():
    # noise of a few tenths of a percent, all three rounds below 1 by chance (1 in 8):
    # too few rounds to claim a slow-down, and the median is within 2%
    r = decide.ratio([0.996, 0.991, 0.999])
    assert r.hi > 1.0 and not r.slower


def test_one_round_has_no_interval():
    r = decide.ratio([1.2])
    assert r.lo == 0 and r.hi == float("inf") and not r.faster and not r.slower
    assert decide.ratio([0.9]).slower        # the median rule still holds


def test_fewer_rounds_widen_the_interval():
    wide, narrow = decide.ratio([1.02, 1.03, 1.01]), decide.ratio([1.02, 1.03, 1.01] * 3)
    assert wide.hi - wide.lo > narrow.hi - narrow.lo
