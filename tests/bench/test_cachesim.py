"""colibri_bench cachesim: the policies on a trace worked out by hand, and a short recorded
trace from a small synthetic model (the bound above both policies, every request counted)."""
import pytest

from colibri_bench import cachesim


def _trace(seq, experts=3):
    """One layer, one expert a token."""
    return {"layers": 1, "experts": experts, "top_k": 1, "picks": [[[e]] for e in seq], "predicted": [[] for _ in seq]}


def test_policies_on_a_trace_worked_by_hand():
    # 2 slots; 0 0 0 1 2 1 2 0: LRU evicts 0 for 2 (hits 1 2 then misses 0), LFU keeps the
    # often-used 0 and swaps 1 and 2 in turn, MIN evicts 0 (needed last)
    tr = _trace([0, 0, 0, 1, 2, 1, 2, 0])
    got = {p: cachesim.simulate(tr, 2, p) for p in ("lru", "lfu", "min")}
    assert (got["lru"]["hits"], got["lru"]["misses"]) == (4, 4)
    assert (got["lfu"]["hits"], got["lfu"]["misses"]) == (3, 5)
    assert (got["min"]["hits"], got["min"]["misses"]) == (4, 4)
    with pytest.raises(ValueError, match="unknown policy"):
        cachesim.simulate(tr, 2, "fifo")


def test_a_layers_experts_are_held_together():
    tr = {"layers": 1, "experts": 8, "top_k": 3, "picks": [[[0, 1, 2]], [[3, 4, 5]]], "predicted": [[], []]}
    with pytest.raises(ValueError, match="cannot hold one layer"):
        cachesim.simulate(tr, 2, "lru")
    assert cachesim.simulate(tr, 3, "lru")["misses"] == 6


def test_a_recorded_trace(lib, tmp_path):
    path = cachesim.synthetic_model(tmp_path / "m.colibri", H=64, E=16, k=2, layers=3)
    tr = cachesim.record(path, tokens=40, seed=1)
    assert tr["layers"] == 3 and len(tr["picks"]) == 40
    assert all(len(p) == 2 and len(set(p)) == 2 for t in tr["picks"] for p in t)
    assert all(len(t) == 2 for t in tr["predicted"])  # none for the last layer
    for slots in (2, 12, 48):
        r = {p: cachesim.simulate(tr, slots, p) for p in ("lru", "lfu", "min")}
        assert all(x["hits"] + x["misses"] == 40 * 3 * 2 for x in r.values())
        assert r["min"]["hits"] >= max(r["lru"]["hits"], r["lfu"]["hits"])
    assert cachesim.simulate(tr, 48, "lru")["misses"] == len({(l, e) for t in tr["picks"] for l, p in enumerate(t)
                                                              for e in p})  # all fit: cold misses only
    assert 0 <= cachesim.predictor(tr)["precision"] <= 1
