"""Bad input at every public entry point, through cffi (the C API) and the Python binding.

The documented behaviour (kernels/colibri.h, docs/usage.md "Bad input and long runs"): a
clear error (status + colibri_last_error(); TypeError / ValueError / ColibriError in
Python) or a documented result, never a crash. NaN/Inf: a token holding one gets a NaN
output row and leaves the other tokens' outputs as they were; NaN logits are never routed
to.
"""
import re
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri import ColibriError
from colibri._checks import MAX_THREADS
from colibri._lib import ffi, last_error

ROOT = Path(__file__).resolve().parents[2]
INVALID = 1
H, I, E, K = 24, 16, 6, 2


def weights(seed=0, S=0):
    rng = np.random.default_rng(seed)
    w = dict(router=rng.standard_normal((E, H), dtype=np.float32),
             gate=rng.standard_normal((E, I, H), dtype=np.float32) * 0.2,
             up=rng.standard_normal((E, I, H), dtype=np.float32) * 0.2,
             down=rng.standard_normal((E, H, I), dtype=np.float32) * 0.2)
    if S:
        w.update(shared_gate=rng.standard_normal((S, H), dtype=np.float32) * 0.2,
                 shared_up=rng.standard_normal((S, H), dtype=np.float32) * 0.2,
                 shared_down=rng.standard_normal((H, S), dtype=np.float32) * 0.2)
    return w


def make_layer(**kw):
    w = weights(S=kw.pop("S", 0))
    return colibri.MoELayer(w.pop("router"), w.pop("gate"), w.pop("up"), w.pop("down"),
                            **{"top_k": K, **w, **kw})


def tokens(T, seed=1):
    return np.random.default_rng(seed).standard_normal((T, H), dtype=np.float32)


def test_max_threads_matches_the_header():
    text = (ROOT / "kernels" / "colibri.h").read_text()
    assert int(re.search(r"#define COLIBRI_MAX_THREADS (\d+)", text).group(1)) == MAX_THREADS


# ------------------------------------------------------------------ C API via cffi

def route_cfg(top_k=K, **kw):
    cfg = ffi.new("colibri_route_config *")
    cfg.scoring, cfg.top_k, cfg.norm_topk_prob = 0, top_k, 1
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def test_capi_route_null_and_counts(lib):
    cfg = route_cfg()
    logits = ffi.new("float[]", 3 * E)
    idx, w, cnt = ffi.new("int32_t[]", 3 * K), ffi.new("float[]", 3 * K), ffi.new("int32_t[]", 3)
    for args in [(ffi.NULL, 3, E, cfg, idx, w, cnt), (logits, 3, E, ffi.NULL, idx, w, cnt),
                 (logits, 3, E, cfg, ffi.NULL, w, cnt), (logits, 3, E, cfg, idx, ffi.NULL, cnt)]:
        assert lib.colibri_route(*args) == INVALID and "NULL" in last_error(lib)
    assert lib.colibri_route(logits, -1, E, cfg, idx, w, cnt) == INVALID
    assert "n_tokens" in last_error(lib)
    for n_exp in (0, -1, 4097):
        assert lib.colibri_route(logits, 3, n_exp, cfg, idx, w, cnt) == INVALID
        assert "n_experts" in last_error(lib)
    for k in (0, -1, E + 1):
        assert lib.colibri_route(logits, 3, E, route_cfg(top_k=k), idx, w, cnt) == INVALID
        assert "top_k" in last_error(lib)
    assert lib.colibri_route(logits, 3, E, route_cfg(dyn_p=float("nan")), idx, w, cnt) == INVALID
    assert lib.colibri_route(logits, 3, E, route_cfg(dyn_p=0.5, k_min=3, k_max=2), idx, w,
                             cnt) == INVALID
    assert "k_min" in last_error(lib)
    # zero tokens: nothing is read, so NULL arrays are fine; counts may always be NULL
    assert lib.colibri_route(ffi.NULL, 0, E, cfg, ffi.NULL, ffi.NULL, ffi.NULL) == 0
    assert lib.colibri_route(logits, 3, E, cfg, idx, w, ffi.NULL) == 0
    assert lib.colibri_route_slots(ffi.NULL) == 0 and "NULL" in last_error(lib)


def test_capi_layer_create_rejects_each_bad_field(lib):
    w = weights()
    keep = [ffi.from_buffer("float[]", a) for a in w.values()]
    scales = ffi.new("float[]", E * H)
    q8 = ffi.new("int8_t[]", E * I * H)

    def desc(**kw):
        d = ffi.new("colibri_layer_desc *")
        d.hidden, d.inter, d.n_experts, d.numa_node = H, I, E, -1
        d.route = route_cfg()[0]
        d.router, d.gate, d.up, d.down = keep
        for k, v in kw.items():
            if k.startswith("route_"):
                setattr(d.route, k[6:], v)
            else:
                setattr(d, k, v)
        return d

    cases = {
        "router": dict(router=ffi.NULL), "gate": dict(gate=ffi.NULL), "up": dict(up=ffi.NULL),
        "down": dict(down=ffi.NULL), "hidden 0": dict(hidden=0), "hidden -1": dict(hidden=-1),
        "inter 0": dict(inter=0), "inter huge": dict(inter=2**30), "n_experts 0": dict(n_experts=0),
        "shared_inter -1": dict(shared_inter=-1), "dtype 3": dict(weight_dtype=3),
        "hugepages 5": dict(hugepages=5), "top_k > E": dict(route_top_k=E + 1),
        "top_k 0": dict(route_top_k=0), "scoring 9": dict(route_scoring=9),
        "numa 100000": dict(numa_node=100000),
        "int8 without scales": dict(weight_dtype=2, gate=q8, up=q8, down=q8),
        "int8 with one scale NULL": dict(weight_dtype=2, gate=q8, up=q8, down=q8,
                                         gate_scales=scales, up_scales=scales),
        "shared half given": dict(shared_inter=4, shared_gate=keep[1], shared_up=keep[2]),
        "gate without shared": dict(shared_expert_gate=keep[0]),
    }
    assert lib.colibri_layer_create(ffi.NULL) == ffi.NULL and "NULL" in last_error(lib)
    for name, kw in cases.items():
        ptr = lib.colibri_layer_create(desc(**kw))
        assert ptr == ffi.NULL, name
        assert last_error(lib), name
    ptr = lib.colibri_layer_create(desc())
    assert ptr != ffi.NULL and last_error(lib) == ""
    lib.colibri_layer_free(ptr)
    lib.colibri_layer_free(ffi.NULL)  # no-op
    assert lib.colibri_layer_page_kind(ffi.NULL) == -1 and "NULL" in last_error(lib)
    assert lib.colibri_layer_weight_bytes(ffi.NULL) == 0 and "NULL" in last_error(lib)


def test_capi_forward_bad_arguments(lib):
    layer = make_layer()
    p = layer._ptr
    x = tokens(3)
    y = np.empty_like(x)
    xp, yp = ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", y)
    for args, word in [((ffi.NULL, xp, yp, 3, 1), "NULL"), ((p, ffi.NULL, yp, 3, 1), "NULL"),
                       ((p, xp, ffi.NULL, 3, 1), "NULL"), ((p, xp, yp, -1, 1), "n_tokens"),
                       ((p, xp, yp, 3, -1), "n_threads"), ((p, xp, yp, 3, 2**31 - 1), "n_threads"),
                       ((p, xp, yp, 3, MAX_THREADS + 1), "n_threads"), ((p, xp, xp, 3, 1), "overlap")]:
        assert lib.colibri_layer_forward(*args) == INVALID, args
        assert word in last_error(lib)
    assert lib.colibri_layer_forward(p, ffi.NULL, ffi.NULL, 0, 1) == 0
    assert lib.colibri_layer_forward(p, xp, yp, 3, 0) == 0


def test_capi_thread_default_is_checked(lib):
    before = lib.colibri_get_num_threads()
    for n in (-1, MAX_THREADS + 1, 2**31 - 1):
        assert lib.colibri_set_num_threads(n) == INVALID and "n_threads" in last_error(lib)
    assert lib.colibri_get_num_threads() == before


def test_capi_pool_bad_arguments(lib):
    assert lib.colibri_pool_create(0, 0, -1) == ffi.NULL and "capacity" in last_error(lib)
    assert lib.colibri_pool_create(4096, 3, -1) == ffi.NULL and "hugepages" in last_error(lib)
    assert lib.colibri_pool_create(2**64 - 1, 0, -1) == ffi.NULL
    assert lib.colibri_pool_alloc(ffi.NULL, 8, 8) == ffi.NULL and "NULL" in last_error(lib)
    for f in ("used", "capacity"):
        assert getattr(lib, f"colibri_pool_{f}")(ffi.NULL) == 0
    for f in ("page_kind", "numa_node"):
        assert getattr(lib, f"colibri_pool_{f}")(ffi.NULL) == -1
    pool = lib.colibri_pool_create(4096, 0, -1)
    try:
        assert lib.colibri_pool_alloc(pool, 8, 6) == ffi.NULL and "power of two" in last_error(lib)
        assert lib.colibri_pool_alloc(pool, 2**64 - 1, 8) == ffi.NULL and "exhausted" in last_error(lib)
    finally:
        lib.colibri_pool_free(pool)
    lib.colibri_pool_free(ffi.NULL)


def test_capi_membw_and_bench_bad_arguments(lib):
    """Every case fails before anything is measured (no benchmark runs here)."""
    r = ffi.new("colibri_membw_result *")
    g = ffi.new("double *")
    assert lib.colibri_membw_run(0, 1 << 20, 1, 0.0, ffi.NULL) == INVALID
    assert lib.colibri_membw(0, 1 << 20, 1, 0.0, ffi.NULL) == INVALID
    assert lib.colibri_membw_run(5, 1 << 20, 1, 0.0, r) == INVALID and "kind" in last_error(lib)
    assert lib.colibri_membw_run(0, 1 << 20, 2**31 - 1, 0.0, r) == INVALID
    assert lib.colibri_membw_run(0, 1 << 20, 1, float("nan"), r) == INVALID
    assert lib.colibri_membw(1, 2**64 - 1, 1, 0.0, g) == INVALID and "too large" in last_error(lib)
    layer = make_layer()
    x = tokens(1)
    xp, yp = ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", np.empty_like(x))
    samples, n = ffi.new("double[]", 4), ffi.new("int *", 7)
    assert lib.colibri_bench_layer(layer._ptr, xp, 1, 1, yp, 1, 0, 0.0, 4, samples,
                                   ffi.NULL) == INVALID
    for bad in [dict(n_inputs=0), dict(n_tokens=0), dict(max_samples=0), dict(warmup=-1),
                dict(n_threads=-1), dict(n_threads=MAX_THREADS + 1), dict(min_seconds=float("nan"))]:
        a = dict(n_inputs=1, n_tokens=1, n_threads=1, warmup=0, min_seconds=0.0, max_samples=4)
        a.update(bad)
        st = lib.colibri_bench_layer(layer._ptr, xp, a["n_inputs"], a["n_tokens"], yp,
                                     a["n_threads"], a["warmup"], a["min_seconds"],
                                     a["max_samples"], samples, n)
        assert st == INVALID and n[0] == 0, bad


def test_capi_route_nan_and_inf_logits(lib):
    logits = np.array([[np.nan] * E,
                       [1.0, np.inf, 0.0, np.inf, np.nan, -np.inf],
                       [-np.inf] * E,
                       [np.nan, 2.0, np.nan, 1.0, np.nan, np.nan]], np.float32)
    idx, w = colibri.route(logits, K, norm_topk_prob=False)
    assert idx[0].tolist() == [-1, -1] and w[0].tolist() == [0.0, 0.0]
    assert idx[1].tolist() == [1, 3] and w[1].tolist() == [0.5, 0.5]
    assert idx[2].tolist() == [0, 1] and np.allclose(w[2], 1 / E)
    assert idx[3].tolist() == [1, 3]  # NaN is never chosen over a number
    assert np.all(np.isfinite(w)) and np.all((w >= 0) & (w <= 1))
    idx, w = colibri.route(logits, K, scoring="softmax_topk")
    assert idx[1].tolist() == [1, 3] and w[1].tolist() == [0.5, 0.5]
    assert np.all(np.isfinite(w))


# ------------------------------------------------------------------ Python binding

@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_token_gives_a_nan_row_only(lib, dtype, bad):
    layer = make_layer(S=8, weight_dtype=dtype)
    x = tokens(9)
    good = [0, 1, 3, 4, 5, 6, 8]
    x[2, 5] = bad
    x[7, :] = bad
    y = layer(x)
    assert np.isnan(y[[2, 7]]).all()
    assert np.isfinite(y[good]).all()
    np.testing.assert_allclose(y[good], layer(np.ascontiguousarray(x[good])), rtol=1e-5, atol=1e-6)


def test_overflowing_finite_token_is_contained(lib):
    layer = make_layer()
    x = tokens(4)
    x[1] = 3e38
    y = layer(x)
    np.testing.assert_allclose(y[[0, 2, 3]], layer(np.ascontiguousarray(x[[0, 2, 3]])), rtol=1e-5,
                               atol=1e-6)


def test_model_nan_row(lib, tmp_path):
    w = weights()
    colibri.save_model(tmp_path / "m.colibri", [dict(w, top_k=K)] * 2)
    with colibri.Model.load(tmp_path / "m.colibri") as m:
        x = tokens(3)
        x[1, 0] = np.nan
        y = m(x)
        assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2]]).all()
        np.testing.assert_allclose(y[[0, 2]], m(np.ascontiguousarray(x[[0, 2]])), rtol=1e-5,
                                   atol=1e-6)


BAD_CONSTRUCTION = {
    "router list": (dict(router=[[1.0]]), TypeError),
    "gate float64": (dict(gate=np.zeros((E, I, H))), TypeError),
    "gate big-endian": (dict(gate=np.zeros((E, I, H), ">f4")), TypeError),
    "gate wrong E": (dict(gate=np.zeros((E + 1, I, H), np.float32)), ValueError),
    "up wrong I": (dict(up=np.zeros((E, I + 1, H), np.float32)), ValueError),
    "down 2-D": (dict(down=np.zeros((E, H), np.float32)), ValueError),
    "gate Fortran": (dict(gate=np.asfortranarray(np.zeros((E, I, H), np.float32))), ValueError),
    "up strided": (dict(up=np.zeros((E, 2 * I, H), np.float32)[:, ::2]), ValueError),
    "no experts": (dict(router=np.zeros((0, H), np.float32), gate=np.zeros((0, I, H), np.float32),
                        up=np.zeros((0, I, H), np.float32), down=np.zeros((0, H, I), np.float32)),
                   ValueError),
    "H 0": (dict(router=np.zeros((E, 0), np.float32), gate=np.zeros((E, I, 0), np.float32),
                 up=np.zeros((E, I, 0), np.float32), down=np.zeros((E, 0, I), np.float32)),
            ValueError),
    "top_k 0": (dict(top_k=0), ValueError),
    "top_k -2": (dict(top_k=-2), ValueError),
    "top_k > E": (dict(top_k=E + 1), ValueError),
    "top_k float": (dict(top_k=2.0), TypeError),
    "top_k bool": (dict(top_k=True), TypeError),
    "dyn_p nan": (dict(dyn_p=float("nan")), ValueError),
    "dyn_p 2": (dict(dyn_p=2.0), ValueError),
    "dyn_p str": (dict(dyn_p="0.5"), TypeError),
    "k_min > k_max": (dict(dyn_p=0.5, k_min=3, k_max=2), ValueError),
    "k_max > E": (dict(dyn_p=0.5, k_max=E + 1), ValueError),
    "scoring": (dict(scoring="sigmoid"), ValueError),
    "scoring list": (dict(scoring=["softmax"]), ValueError),
    "weight_dtype": (dict(weight_dtype="f16"), ValueError),
    "threads 0": (dict(threads=0), ValueError),
    "threads -1": (dict(threads=-1), ValueError),
    "threads huge": (dict(threads=MAX_THREADS + 1), ValueError),
    "threads float": (dict(threads=2.5), TypeError),
    "numa str": (dict(numa_node="0"), TypeError),
    "numa huge": (dict(numa_node=10**6), ValueError),
    "shared partial": (dict(shared_gate=np.zeros((4, H), np.float32)), ValueError),
    "expert gate without shared": (dict(shared_expert_gate=np.zeros(H, np.float32)), ValueError),
    "shared_down wrong": (dict(shared_gate=np.zeros((4, H), np.float32),
                               shared_up=np.zeros((4, H), np.float32),
                               shared_down=np.zeros((4, H), np.float32)), ValueError),
}


@pytest.mark.parametrize("case", sorted(BAD_CONSTRUCTION))
def test_layer_construction_rejects(lib, case):
    kw, exc = BAD_CONSTRUCTION[case]
    args = dict(weights(), top_k=K)
    args.update(kw)
    with pytest.raises(exc):
        colibri.MoELayer(args.pop("router"), args.pop("gate"), args.pop("up"), args.pop("down"),
                         **args)


def test_layer_accepts_read_only_weights_and_input(lib):
    w = weights()
    for a in w.values():
        a.flags.writeable = False
    layer = colibri.MoELayer(w["router"], w["gate"], w["up"], w["down"], top_k=K)
    x = tokens(3)
    ref = layer(x)
    x.flags.writeable = False
    np.testing.assert_array_equal(layer(x), ref)


def test_layer_call_rejects(lib):
    layer = make_layer()
    x = tokens(4)
    with pytest.raises(TypeError):
        layer(x.tolist())
    with pytest.raises(TypeError):
        layer(x.astype(np.float64))
    with pytest.raises(ValueError):
        layer(x[0])  # 1-D
    with pytest.raises(ValueError):
        layer(np.zeros((4, H + 1), np.float32))
    with pytest.raises(ValueError):
        layer(np.asfortranarray(x))
    with pytest.raises(ValueError):
        layer(np.zeros((8, H), np.float32)[::2])
    out_ro = np.empty_like(x)
    out_ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        layer(x, out=out_ro)
    with pytest.raises(ValueError):
        layer(x, out=np.empty((3, H), np.float32))
    with pytest.raises(TypeError):
        layer(x, out=np.empty((4, H), np.float64))
    with pytest.raises(ValueError, match="overlap"):
        layer(x, out=x)
    assert layer(np.zeros((0, H), np.float32)).shape == (0, H)


def test_layer_use_after_close_raises(lib):
    layer = make_layer()
    x = tokens(2)
    y = layer(x)
    with layer as same:
        np.testing.assert_array_equal(same(x), y)
    assert layer.closed
    with pytest.raises(ValueError, match="closed"):
        layer(x)
    with pytest.raises(ValueError, match="closed"):
        layer.weight_bytes
    with pytest.raises(ValueError, match="closed"):
        layer.page_kind
    layer.close()  # twice is fine


def test_from_encoded_rejects(lib):
    w = weights()
    router = w.pop("router")
    enc = {n: (a, None) for n, a in w.items()}
    with pytest.raises(ValueError):
        colibri.MoELayer.from_encoded(router, {"gate": enc["gate"]}, weight_dtype="f32", top_k=K)
    with pytest.raises(TypeError):
        colibri.MoELayer.from_encoded(router, dict(enc, up=enc["up"][0]), weight_dtype="f32",
                                      top_k=K)
    with pytest.raises(TypeError):
        colibri.MoELayer.from_encoded(router, enc, weight_dtype="bf16", top_k=K)
    with pytest.raises(ValueError):
        colibri.MoELayer.from_encoded(router, dict(enc, gate=(w["gate"][0], None)),
                                      weight_dtype="f32", top_k=K)
    with pytest.raises(TypeError):  # int8 without its scales
        q = {n: (a.astype(np.int8), None) for n, a in w.items()}
        colibri.MoELayer.from_encoded(router, q, weight_dtype="int8", top_k=K)


def test_route_rejects(lib):
    logits = np.zeros((3, E), np.float32)
    with pytest.raises(TypeError):
        colibri.route(logits.tolist(), K)
    with pytest.raises(TypeError):
        colibri.route(logits.astype(np.float64), K)
    with pytest.raises(ValueError):
        colibri.route(logits[0], K)
    with pytest.raises(ValueError):
        colibri.route(np.zeros((3, 0), np.float32), 1)
    with pytest.raises(ValueError):
        colibri.route(logits, E + 1)
    with pytest.raises(ValueError):
        colibri.route(logits, 0)
    with pytest.raises(ValueError):
        colibri.route(np.zeros((6, E), np.float32)[::2], K)
    with pytest.raises(ColibriError, match="n_experts"):  # above COLIBRI_MAX_EXPERTS: the engine says
        colibri.route(np.zeros((1, 4097), np.float32), 1)
    idx, w = colibri.route(np.zeros((0, E), np.float32), K)
    assert idx.shape == (0, K) and w.shape == (0, K)


def test_model_bad_input(lib, tmp_path):
    w = weights()
    path = tmp_path / "m.colibri"
    colibri.save_model(path, [dict(w, top_k=K)])
    with pytest.raises(TypeError):
        colibri.Model.load(None)
    with pytest.raises(FileNotFoundError):
        colibri.Model.load(tmp_path / "missing")
    with pytest.raises(ColibriError, match="not a regular file"):
        colibri.Model.load(tmp_path)
    (tmp_path / "junk").write_bytes(b"\x00" * 300)
    with pytest.raises(colibri.ModelFormatError):
        colibri.Model.load(tmp_path / "junk")
    m = colibri.Model.load(path)
    x = tokens(2)
    with pytest.raises(TypeError):
        m(x.astype(np.float64))
    with pytest.raises(ValueError):
        m(np.zeros((2, H + 1), np.float32))
    with pytest.raises(ValueError):
        m(np.asfortranarray(x))
    ro = np.empty_like(x)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        m(x, out=ro)
    with pytest.raises(IndexError):
        m.layer_weight_bytes(1)
    with pytest.raises(TypeError):
        m.layer_weight_bytes(0.0)
    assert m(np.zeros((0, H), np.float32)).shape == (0, H)
    m.close()
    with pytest.raises(ValueError, match="closed"):
        m(x)
    with pytest.raises(ValueError, match="closed"):
        m.layer_weight_bytes(0)
    m.close()
