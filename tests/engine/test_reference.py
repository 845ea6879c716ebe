"""colibri.reference.compare: what counts as the engine agreeing with the reference."""
import numpy as np

from colibri import reference


def _ref():
    return np.random.default_rng(0).standard_normal((9, 400))


def test_float_formats_need_every_element_within_1e4():
    ref = _ref()
    assert reference.compare(ref * (1 + 5e-5), ref, "f32")[0]
    bad = ref.copy()
    bad[3, 7] += 1e-3 * (abs(bad[3, 7]) + np.mean(np.abs(bad[3])))
    ok, worst, msg = reference.compare(bad, ref, "bf16")
    assert not ok and worst > 1e-4 and "max relative error" in msg


def test_quantized_formats_allow_a_flipped_step_but_not_a_wrong_kernel():
    ref = _ref()
    flipped = ref.copy()
    flipped[2] += 3e-3 * np.random.default_rng(1).standard_normal(400)  # one token's row moved
    assert reference.compare(flipped, ref, "int8")[0]
    assert reference.compare(flipped, ref, "int4g32")[0]
    assert not reference.compare(flipped, ref, "f32")[0]
    everywhere = ref * (1 + 3e-4)  # a small error on every element: wrong arithmetic
    ok, _, msg = reference.compare(everywhere, ref, "int4g32")
    assert not ok and "median" in msg
    one_far = ref.copy()
    one_far[5, 5] += 0.2 * (abs(ref[5, 5]) + np.mean(np.abs(ref[5])))
    ok, _, msg = reference.compare(one_far, ref, "int8")
    assert not ok and "max relative error" in msg
    many_rows = ref.copy()
    many_rows[:] += 2e-3 * np.random.default_rng(2).standard_normal(ref.shape) * np.abs(ref)
    ok, _, msg = reference.compare(many_rows, ref, "int8")
    assert not ok


def test_shape_and_non_finite_outputs_fail():
    ref = _ref()
    assert not reference.compare(ref[:, :-1], ref)[0]
    nan = ref.copy()
    nan[0, 0] = np.nan
    assert reference.compare(nan, ref, "int8")[1] == float("inf")
