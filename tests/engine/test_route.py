"""Routing against the float64 reference, every scoring mode, E up to 256."""
import numpy as np
import pytest

import colibri
from colibri import reference


def logits_with_margin(T, E, seed=0):
    """Well-separated logits: a random permutation of spaced values plus small noise."""
    rng = np.random.default_rng(seed)
    base = np.arange(E, dtype=np.float64) * 0.05
    out = np.stack([rng.permutation(base) for _ in range(T)]) + rng.uniform(0, 0.01, (T, E))
    return (out * 4.0).astype(np.float32)


MODES = [
    dict(scoring="softmax", norm_topk_prob=True),
    dict(scoring="softmax", norm_topk_prob=False),
    dict(scoring="softmax_topk", norm_topk_prob=False),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("E,k", [(8, 2), (60, 4), (128, 8), (256, 8), (256, 1), (5, 5)])
def test_fixed_k_matches_reference(lib, mode, E, k):
    logits = logits_with_margin(33, E)
    idx, w = colibri.route(logits, k, **mode)
    assert idx.shape == (33, k) and w.shape == (33, k)
    ref = reference.route(logits, k, mode["scoring"], mode["norm_topk_prob"])
    for t, (ri, rw) in enumerate(ref):
        np.testing.assert_array_equal(idx[t], ri)
        np.testing.assert_allclose(w[t], rw, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("scoring", ["softmax", "softmax_topk"])
@pytest.mark.parametrize("p,kmin,kmax", [(0.5, 1, 8), (0.9, 2, 6), (0.3, 3, 3), (1.0, 1, 16)])
def test_dynamic_count_matches_reference(lib, scoring, p, kmin, kmax):
    E = 64
    # a different temperature per token, so that the mass reaches p at different counts
    temp = np.random.default_rng(4).uniform(0.5, 6.0, (41, 1)).astype(np.float32)
    logits = logits_with_margin(41, E, seed=3) * temp
    idx, w = colibri.route(logits, kmax, scoring=scoring, norm_topk_prob=True, dyn_p=p,
                           k_min=kmin, k_max=kmax)
    ref = reference.route(logits, kmax, scoring, True, p, kmin, kmax)
    counts = []
    for t, (ri, rw) in enumerate(ref):
        n = len(ri)
        counts.append(n)
        assert kmin <= n <= kmax
        np.testing.assert_array_equal(idx[t, :n], ri)
        np.testing.assert_allclose(w[t, :n], rw, rtol=1e-5, atol=1e-7)
        assert np.all(idx[t, n:] == -1) and np.all(w[t, n:] == 0)
    if kmin < kmax and p < 1.0:
        assert len(set(counts)) > 1, "dynamic mode chose the same count for every token"


def test_ties_go_to_the_lower_index(lib):
    logits = np.array([[1, 3, 3, 0, 3]], np.float32)
    idx, w = colibri.route(logits, 2, scoring="softmax")
    assert idx.tolist() == [[1, 2]]
    np.testing.assert_allclose(w, [[0.5, 0.5]], rtol=1e-6)


def test_weights_sum_to_one_when_renormalised(lib):
    logits = logits_with_margin(100, 128, seed=5)
    _, w = colibri.route(logits, 8, scoring="softmax", norm_topk_prob=True)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-5)
    _, w = colibri.route(logits, 8, scoring="softmax", norm_topk_prob=False)
    assert np.all(w.sum(axis=1) < 1.0)


@pytest.mark.parametrize("kw, msg", [
    (dict(top_k=0), "top_k"),
    (dict(top_k=9), "top_k"),
    (dict(top_k=2, scoring="nope"), "scoring"),
    (dict(top_k=2, dyn_p=0.5, k_min=3, k_max=2), "k_min"),
    (dict(top_k=2, dyn_p=1.5, k_min=1, k_max=2), "dyn_p"),
])
def test_bad_config_is_a_clear_error(lib, kw, msg):
    with pytest.raises(ValueError, match=msg):
        colibri.route(np.zeros((2, 8), np.float32), **kw)


def test_c_api_rejects_bad_arguments(lib):
    """The C entry point itself checks, for callers that are not the binding."""
    from colibri._lib import ffi, last_error

    cfg = ffi.new("colibri_route_config *", {"scoring": 0, "top_k": 3})
    idx = ffi.new("int32_t[6]")
    w = ffi.new("float[6]")
    logits = ffi.new("float[4]")
    assert lib.colibri_route(logits, 2, 2, cfg, idx, w, ffi.NULL) == 1
    assert "top_k 3" in last_error(lib)
    assert lib.colibri_route(ffi.NULL, 1, 4, cfg, idx, w, ffi.NULL) == 1
    assert "NULL" in last_error(lib)
    cfg.scoring = 7
    assert lib.colibri_route(logits, 1, 4, cfg, idx, w, ffi.NULL) == 1
    assert "scoring 7" in last_error(lib)
