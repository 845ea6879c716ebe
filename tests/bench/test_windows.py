"""colibri_bench/windows.py: rounds paired with the bandwidth readings around them."""
import pytest

from colibri_bench import windows


def test_each_round_against_the_better_reading_around_it():
    # three rounds at 30 GB/s; readings before/after: 40, 50, 60, 60
    w = windows.summary([30.0, 30.0, 30.0], [40.0, 50.0, 60.0, 60.0])
    assert w["all"] == pytest.approx(30 / 60)  # shares 30/50, 30/60, 30/60
    assert w["best_gbps"] == 60.0
    # 40 is under 80% of 60: the readings moved; rounds 2 and 3 saw both readings >= 48
    assert w["moved"] and w["fast_rounds"] == 2 and w["fast"] == pytest.approx(0.5)
    assert w["slow_rounds"] == 0 and w["slow"] is None  # no round with both readings < 42


def test_fast_and_slow_windows_apart():
    # slow rounds near 33 GB/s reading 32; fast ones near 60 reading 50
    gbps = [32.0, 50.0, 32.0, 50.0]
    readings = [33.0, 33.0, 60.0, 34.0, 60.0]
    w = windows.summary(gbps, readings)
    # round 1 (33, 33): slow; round 2 (33, 60): neither; round 3 (60, 34): neither; round 4 (34, 60)
    assert w["slow_rounds"] == 1 and w["slow"] == pytest.approx(32 / 33)
    assert w["fast_rounds"] == 0
    w = windows.summary([50.0, 50.0, 32.0], [60.0, 58.0, 60.0, 33.0])
    assert w["fast_rounds"] == 2 and w["fast"] == pytest.approx(50 / 60)  # 50/60, 50/60
    assert windows.text(w) == "fast 83% (n=2), slow - (n=0)"


def test_rounds_without_a_reading_or_time_are_left_out():
    assert windows.summary([], [30.0]) is None
    assert windows.summary([None, 30.0], [None, 40.0, 40.0])["all"] == pytest.approx(0.75)
    assert windows.text(None) == ""


def test_a_run_that_stayed_slow_is_judged_against_the_best_of_a_longer_run():
    gbps, readings = [30.0, 31.0], [33.0, 34.0, 32.0]
    w = windows.summary(gbps, readings)  # against its own best: all of it counts as fast
    assert not w["moved"] and w["fast_rounds"] == 2
    w = windows.summary(gbps, readings, best=60.0)  # against the run's 60 GB/s: slow windows
    assert w["moved"] and w["fast_rounds"] == 0 and w["slow_rounds"] == 2
    assert w["slow"] == pytest.approx((30 / 34 + 31 / 34) / 2) and w["best_gbps"] == 60.0
    assert windows.text(w) == "fast - (n=0), slow 90% (n=2)"


def test_rounds_with_readings_of_their_own():
    # a round's own readings, not shared with the next round: (60, 58) fast, (33, 34) slow
    w = windows.summary_of_pairs([50.0, 32.0], [(60.0, 58.0), (33.0, 34.0)])
    assert w["fast_rounds"] == 1 and w["fast"] == pytest.approx(50 / 60)
    assert w["slow_rounds"] == 1 and w["slow"] == pytest.approx(32 / 34)
    assert w == windows.summary_of_pairs([50.0, 32.0], [[58.0, 60.0], [34.0, 33.0]])  # either order
    # the chain form is the pairs of consecutive readings
    assert windows.summary([50.0, 32.0], [60.0, 58.0, 34.0]) == \
        windows.summary_of_pairs([50.0, 32.0], [(60.0, 58.0), (58.0, 34.0)])
    assert windows.summary_of_pairs([50.0], [(None, 60.0)]) is None


def test_values_apart_by_window():
    # A/B ratios of four rounds: 1.10 and 1.06 between fast readings, 0.99 between slow ones,
    # 1.30 across a move (neither window); judged against a run's best of 60 GB/s
    ratios, readings = [1.10, 1.06, 1.30, 0.99], [59.0, 58.0, 57.0, 33.0, 34.0]
    w = windows.values_by_window(ratios, readings, 60.0)
    assert w["fast_rounds"] == 2 and w["fast"] == pytest.approx(1.08)
    assert w["slow_rounds"] == 1 and w["slow"] == pytest.approx(0.99)
    # a round without a reading on either side is left out; none in a window: None
    w = windows.values_by_window([1.0, 1.2], [None, 33.0, 34.0], 60.0)
    assert w == {"fast": None, "fast_rounds": 0, "slow": 1.2, "slow_rounds": 1}


def test_ab_prints_the_ratio_and_both_shares_by_window(capsys):
    from colibri_bench import ab
    from tuner.measure import problems as problems_mod

    case = "qwen3-30b-a3b/decode/int4"
    nb = problems_mod.problem(case).decode_bytes
    a = [nb / 45e9, nb / 30e9]  # A: 45 GB/s in the fast round, 30 in the slow one
    b = [nb / 50e9, nb / 31e9]
    pre = {"case": "qwen3-30b-a3b/prefill128/int4", "threads": 2, "rounds_a": [2.0, 1.0],
           "rounds_b": [1.0, 1.0], "read_bw_rounds": [60.0, 58.0, 34.0]}
    rows = [{"case": case, "threads": 2, "rounds_a": a, "rounds_b": b, "read_bw_rounds": [60.0, 58.0, 34.0]}, pre]
    ab.print_windows(rows)
    out = capsys.readouterr().out
    assert rows[0]["ratio_windows"]["fast"] == pytest.approx(50 / 45)
    assert rows[0]["windows"]["fast"] == pytest.approx(50 / 60) and rows[0]["windows_a"]["fast"] == pytest.approx(45 / 60)
    assert rows[1]["ratio_windows"] == {"fast": 2.0, "fast_rounds": 1, "slow": None, "slow_rounds": 0}
    assert "windows" not in rows[1]  # prefill: no share of the bandwidth
    assert f"{case}" in out and "A/B fast 1.111 (n=1)" in out and "B fast 83% (n=1)" in out and "A fast 75% (n=1)" in out
