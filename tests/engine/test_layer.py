"""The fused MoE layer against the float64 NumPy reference.

Tolerance: f32 weights within 1e-4 relative (see moe_data.assert_close). bf16 and
int8 (and int4g32, int4) weights are compared, at the same 1e-4, with the reference computed from the
dequantized weights the engine holds: the kernels add no error of their own beyond
float32 accumulation. The int8 and int4g32 kernels quantize the activations before each
matrix to int8 per group of 32; the reference does the same
(colibri.quant.quantize_activations). The intermediate h is computed in float32 by
the engine and float64 by the reference, so where an h value sits on a rounding
boundary of its int8 step the two can round it apart: the int8/int4g32 cases with many
tokens are compared as colibri.reference.compare states (a few outputs next to a
flipped step may be off by up to 5e-2, the whole output within 1e-3 L2). The error
the formats themselves add is bounded in test_quant.py.
"""
import numpy as np
import pytest

import colibri
from moe_data import REFERENCE_SHAPES, assert_engine, make_case

DTYPES = ["f32", "bf16", "int8", "int4g32", "int4"]


# awkward shapes: H not a multiple of any vector width, E=60, k=1, k=E, T=1 and T=513
AWKWARD = {
    "h67-k1": dict(H=67, I=45, E=8, k=1),
    "e60-k4": dict(H=130, I=70, E=60, k=4),
    "k-eq-e": dict(H=45, I=33, E=6, k=6),
    "h1-i1": dict(H=1, I=1, E=3, k=2),
}
ROUTINGS = {
    "softmax-norm": dict(scoring="softmax", norm=True),
    "softmax-raw": dict(scoring="softmax", norm=False),
    "softmax_topk": dict(scoring="softmax_topk", norm=False),
}


def layer(case, dtype="f32", **kw):
    return colibri.MoELayer(case.router, case.gate, case.up, case.down, weight_dtype=dtype,
                            **case.layer_kwargs(), **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("routing", sorted(ROUTINGS))
@pytest.mark.parametrize("shape", sorted(AWKWARD))
@pytest.mark.parametrize("T", [1, 513])
def test_awkward_shapes(lib, shape, routing, dtype, T):
    case = make_case(**AWKWARD[shape], **ROUTINGS[routing])
    x = case.inputs(T)
    assert_engine(layer(case, dtype)(x), case.reference(x, dtype), dtype)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_activations_exact_in_bf16(lib, dtype):
    """A bf16 model's activations are exact in bf16: the bf16 pair-dot gemm then skips the lo
    half of the split (all zero) for the gate/up products; the down products keep it."""
    from colibri import quant

    case = make_case(H=130, I=70, E=3, k=2, seed=9)
    x = quant.roundtrip(case.inputs(300), "bf16")
    assert_engine(layer(case, dtype)(x), case.reference(x, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dyn", [dict(dyn_p=0.6, k_min=1, k_max=4), dict(dyn_p=0.9, k_min=2, k_max=5),
                                 dict(dyn_p=1.0, k_min=1, k_max=3)])
def test_dynamic_expert_count(lib, dyn, dtype):
    case = make_case(H=70, I=40, E=12, k=dyn["k_max"], **dyn)
    x = case.inputs(37)
    assert_engine(layer(case, dtype)(x), case.reference(x, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [True, False])
def test_shared_expert(lib, dtype, gated):
    case = make_case(H=96, I=40, E=10, k=3, S=57, gated=gated, norm=False)
    x = case.inputs(19)
    assert_engine(layer(case, dtype)(x), case.reference(x, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("experts", ["16-experts-17-tokens", "4-experts-150-tokens"])
def test_thread_count_does_not_change_the_result(lib, dtype, experts):
    """Every output element is computed by one thread in a fixed order: bitwise equal. From
    two threads on, the down projection's activation panels (bf16 hi/lo for the bf16 pair-dot
    and AMX paths; quantized for the int gemms, which packed int layers take from 128 tokens
    an expert) are converted once by all the threads together, at one thread by the thread
    itself: the same panels either way."""
    E, k, T = (16, 4, 70) if experts == "16-experts-17-tokens" else (4, 2, 300)
    case = make_case(H=300, I=130, E=E, k=k, S=40, gated=True)
    x = case.inputs(T)
    outs = [layer(case, dtype, threads=n)(x) for n in (1, 2, 3, 7)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    assert_engine(outs[0], case.reference(x, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_claimed_work_is_the_same_at_every_thread_count(lib, dtype):
    """Threads claim a call's work in chunks (kernels/claim.c). Decode: about 2^20 weights
    an item, here 3 gate/up chunks per expert and 2 down chunks at one token, 6 and 3 at two.
    Prefill: about 2^25 weights x tokens and at most 2 chunks per thread, so at 120 tokens
    (about 90 per expert) 4, 6 and about 8 gate/up chunks per expert at 2, 3 and 4 threads (the
    cap), at 3 tokens experts of 1-3 tokens, and the down projections in
    column chunks over every expert. A shared expert of other sizes runs beside them. Each
    output is the one-thread call's bits at any thread count, an odd one included."""
    case = make_case(H=1024, I=1536, E=4, k=3, S=700, gated=True, seed=5)
    layers = [layer(case, dtype, threads=n) for n in (1, 2, 3, 4)]
    for T in (1, 2, 3, 120):
        x = case.inputs(T)
        outs = [L(x) for L in layers]
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])
        assert_engine(outs[0], case.reference(x, dtype), dtype)


@pytest.fixture(scope="module", params=sorted(REFERENCE_SHAPES))
def reference_case(request):
    shape = dict(REFERENCE_SHAPES[request.param])
    if request.param == "mixtral-8x7b":
        # 2 of its 8 experts, top-2 still: its 14336 x 4096 rows are what makes the case
        # (the kernels see each expert alone; routing has its own tests), and each other
        # expert costs the suite about 10 s
        shape["E"] = 2
    return make_case(**shape)


def _decode_and_prefill(case, dtype):
    """The engine at T=1 and T=9, one call each, against the reference. The reference runs
    once on both token sets together and is sliced: its rows are independent (routing,
    shared expert and activation rounding are per token), and each routed expert's weights
    are converted to float64 once, not once per T."""
    L = layer(case, dtype)
    xs = [case.inputs(T, seed=T) for T in (1, 9)]
    refs = np.split(case.reference(np.concatenate(xs), dtype), [len(xs[0])])
    for x, ref in zip(xs, refs):
        assert_engine(L(x), ref, dtype)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "int4"])
def test_reference_shapes(lib, reference_case, dtype):
    """Real model shapes (weights of every expert resident), decode and a short prefill."""
    _decode_and_prefill(reference_case, dtype)


def test_reference_shape_int4k(lib):
    """int4 on one real shape, DeepSeek-V2-Lite's: its 1408-wide down rows end in a
    half super-block (the other shapes' rows are whole ones; quantizing every shape's
    experts would add minutes to the suite). 8 of its 64 experts, top-6 still: the rows
    are what the case is for, and quantizing the other 56 took about 18 s."""
    _decode_and_prefill(make_case(**dict(REFERENCE_SHAPES["deepseek-v2-lite"], E=8)), "int4")


def test_layer_reports_its_arena(lib, thp_offered):
    case = make_case(H=64, I=32, E=4, k=2)
    L = layer(case, hugepages=False)
    assert L.page_kind == "normal"
    # router + 4 experts x 3 matrices of 64x32 f32, each 64-byte aligned
    assert L.weight_bytes == 4 * 64 * 4 + 4 * 3 * 64 * 32 * 4
    Lh = layer(case, hugepages=True)
    assert Lh.page_kind == "normal"  # under 2 MiB: nothing to gain from huge pages
    big = make_case(H=256, I=128, E=16, k=2)  # 6 MiB of f32 experts
    Lb = layer(big)  # huge pages are the default
    assert Lb.page_kind in ("hugetlb", "thp") or not thp_offered
    xb = big.inputs(3)
    np.testing.assert_array_equal(Lb(xb), layer(big, hugepages=False)(xb))
    x = case.inputs(3)
    np.testing.assert_array_equal(L(x), Lh(x))


def test_zero_tokens(lib):
    case = make_case(H=16, I=8, E=4, k=2)
    assert layer(case)(np.zeros((0, 16), np.float32)).shape == (0, 16)


@pytest.mark.parametrize("bad, err", [
    (lambda x: x.astype(np.float64), TypeError),
    (lambda x: x[:, :-1], ValueError),
    (lambda x: x.reshape(-1), ValueError),
    (lambda x: np.asfortranarray(np.repeat(x, 2, axis=0)), ValueError),
    (lambda x: x.tolist(), TypeError),
])
def test_bad_input_is_a_clear_error(lib, bad, err):
    case = make_case(H=16, I=8, E=4, k=2)
    with pytest.raises(err):
        layer(case)(bad(case.inputs(3)))


def test_bad_weights_are_clear_errors(lib):
    case = make_case(H=16, I=8, E=4, k=2)
    r, g, u, d = case.router, case.gate, case.up, case.down
    with pytest.raises(ValueError, match="top_k"):
        colibri.MoELayer(r, g, u, d, top_k=5)
    with pytest.raises(ValueError, match="top_k"):
        colibri.MoELayer(r, g, u, d, top_k=0)
    with pytest.raises(ValueError, match="up must have shape"):
        colibri.MoELayer(r, g, u[:, :, :-1].copy(), d, top_k=2)
    with pytest.raises(TypeError, match="gate must have dtype float32"):
        colibri.MoELayer(r, g.astype(np.float16), u, d, top_k=2)
    with pytest.raises(ValueError, match="weight_dtype"):
        colibri.MoELayer(r, g, u, d, top_k=2, weight_dtype="fp8")
    with pytest.raises(ValueError, match="scoring"):
        colibri.MoELayer(r, g, u, d, top_k=2, scoring="sigmoid")
    with pytest.raises(ValueError, match="go together"):
        colibri.MoELayer(r, g, u, d, top_k=2, shared_gate=g[0])
