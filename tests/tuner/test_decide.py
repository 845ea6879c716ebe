"""When a measured speed-up counts (tuner/decide.py), how a class's winner is chosen from
its race (tuner/classes.py), and when a race stops (tuner/measure/interleave.py): injected
timings, no clock."""
from types import SimpleNamespace

import pytest

from tuner import classes, decide


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
    t = SimpleNamespace(say=said.append, label=str)
    entries = classes.retime_entries([DEFAULT, CAND], per_lib, DEFAULT, NAMES)
    return classes.choose(t, "decode", entries), entries, said


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
    f32 = classes.retime_entries([{"prefetch_f32": 8192}, {"prefetch_f32": 0}],
                                 [[_rounds(1.0, 1.0)], [_rounds(1.0, 0.85)]],
                                 {"prefetch_f32": 8192}, ["tiny/decode/f32"])
    bf16 = classes.retime_entries([{"prefetch_bf16": 8192}, {"prefetch_bf16": 0}],
                                  [[_rounds(1.0, 1.0)], [_rounds(1.0, 1.25)]],
                                  {"prefetch_bf16": 8192}, ["tiny/decode/bf16"])
    t = SimpleNamespace(say=lambda m: None, label=str)
    assert classes.choose(t, "decode_f32", f32)["knobs"] == {"prefetch_f32": 0}
    assert classes.choose(t, "decode_bf16", bf16)["knobs"] == {"prefetch_bf16": 8192}


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


# ---------------------------------------------------------------- racing

def test_race_step_names_each_candidates_state():
    d = [[1.0, 1.01, 0.99, 1.0]]
    got = decide.race_step(d, {"faster": [[0.8, 0.81, 0.79, 0.8]],
                               "slower": [[1.2, 1.21, 1.19, 1.2]],
                               "tie": [[1.0, 1.001, 0.99, 1.0]],
                               "open": [[0.9, 1.1, 0.8, 1.2]],
                               "worse": [[0.85, 0.86, 0.84, 0.85]]}, ["p"])
    assert got == {"faster": "faster", "slower": "slower", "tie": "tie", "open": "open",
                   "worse": "worse"}


def test_a_candidate_slower_on_one_problem_is_settled_as_slower():
    d = [[1.0] * 4, [2.0] * 4]
    c = [[0.8, 0.81, 0.79, 0.8], [2.2, 2.21, 2.19, 2.2]]
    assert decide.race_step(d, {"c": c}, ["a", "b"]) == {"c": "slower"}


class _FakeSession:
    """worker.Session replaced: each round returns the injected seconds of its libraries."""
    script: dict = {}
    rounds_seen: list = []

    checked: list = []  # per session, the libraries it was asked to check
    libs_seen: list = []  # per session, its libraries in order

    def __init__(self, libs, problems, **kw):
        self.libs, self.problems, self.threads = list(libs), list(problems), kw["threads"]
        verify = kw.get("verify") or [False] * len(self.libs)
        _FakeSession.checked.append(list(verify))
        _FakeSession.libs_seen.append(list(self.libs))
        self.verified = [{"status": "ok"} if v else None for v in verify]
        self.bandwidth = {}
        self.r = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def round(self, live):
        _FakeSession.rounds_seen.append(list(live))
        out = {}
        for p in self.problems:
            for th in self.threads:
                out[(p.name, th)] = [(_FakeSession.script[lib][self.r % len(_FakeSession.script[lib])]
                                      if i in live else None) for i, lib in enumerate(self.libs)]
        self.r += 1
        return out


def _race(monkeypatch, script, rounds=(3, 10)):
    from tuner.measure import interleave, problems, worker

    monkeypatch.setattr(worker, "Session", _FakeSession)
    monkeypatch.setattr(interleave, "prepare", lambda *a, **k: None)
    _FakeSession.script, _FakeSession.rounds_seen = script, []
    names = ["tiny/decode/f32"]
    probs = [problems.problem(n) for n in names]

    def step(res):
        live = [i for i in res.live if i != 0]
        rows = res.common([0, *live])
        status = decide.race_step(rows[0], dict(zip(live, rows[1:])), names)
        if not any(s == "open" for s in status.values()):
            return None
        return [0] + [i for i in live if status[i] in ("open", "faster")]

    return interleave.interleave(list(script), probs, threads=[1], weights_dir="/nonexistent",
                                 rounds=rounds, step=step)


def test_a_race_drops_a_clear_loser_and_stops_when_nothing_is_open(monkeypatch):
    wobble = [1.0, 1.004, 0.996, 1.002, 0.998]
    res = _race(monkeypatch, {"default": wobble,
                              "loser": [1.3 * w for w in reversed(wobble)],
                              "open": [0.8, 1.25, 0.85, 1.2, 0.9, 1.15, 0.95, 1.1, 1.0, 1.05],
                              "winner": [0.8 * w for w in wobble]})
    # the loser is out after the first decision; the open one is kept until it settles or
    # the rounds end; the race never runs past its maximum
    assert res.dropped.get(1) == 3
    assert all(1 not in live for live in _FakeSession.rounds_seen[3:])
    assert res.rounds <= 10 and 3 in res.live


def test_a_race_of_a_tie_stops_at_its_first_decision(monkeypatch):
    wobble = [1.0, 1.001, 0.999, 1.0005, 0.9995]
    res = _race(monkeypatch, {"default": wobble, "same": [w * 1.0002 for w in wobble]})
    assert res.rounds == 3 and not res.dropped  # settled as a tie: stopped, nothing dropped


def test_a_race_with_a_clear_winner_stops_at_its_first_decision(monkeypatch):
    wobble = [1.0, 1.002, 0.998]
    res = _race(monkeypatch, {"default": wobble, "fast": [0.7 * w for w in wobble]})
    assert res.rounds == 3
    v = decide.verdict(*(res.rows(i) for i in (0, 1)), ["tiny/decode/f32"])
    assert v["adopt"]


def test_a_race_loads_the_default_last_and_checks_it_once_per_run(monkeypatch, tmp_path):
    from tuner.measure import interleave, problems, worker

    monkeypatch.setattr(worker, "Session", _FakeSession)
    monkeypatch.setattr(interleave, "prepare", lambda *a, **k: None)
    wobble = [1.0, 1.002, 0.998]
    _FakeSession.rounds_seen, _FakeSession.checked, _FakeSession.libs_seen = [], [], []
    t = SimpleNamespace(
        cfg=SimpleNamespace(threads=1, race_rounds=(3, 3), race_budget_s=60.0, race_min_seconds=0.01,
                            seed=0, worker_timeout_s=60.0),
        problems=[problems.problem("tiny/decode/f32")], work=tmp_path, profile_name="generic",
        verified=set(), say=lambda m: None, store=SimpleNamespace(get=lambda key: "kept"),
        key=lambda k, p: None, measured=0, label=lambda k: str(k))
    dflt, a, b = {"x": 0}, {"x": 1}, {"x": 2}
    def lib(k):  # where race() looks for a variant's library
        return classes.variants.variant_dir(tmp_path / "variants", "generic",
                                            classes.variant_id(k)) / "libcolibri.so"

    _FakeSession.script = {lib(dflt): wobble, lib(a): [0.99 * w for w in wobble],
                           lib(b): [1.01 * w for w in wobble]}
    classes.race(t, "c1", [a, dflt], dflt, verify=True)
    classes.race(t, "c2", [b, dflt], dflt, verify=True)
    # the default goes first (the worker loads it last: a first-loaded model runs slow)
    assert [libs[0] for libs in _FakeSession.libs_seen] == [lib(dflt), lib(dflt)]
    # the default, checked in the first class's race, is not checked in the second's
    assert _FakeSession.checked == [[True, True], [False, True]]
