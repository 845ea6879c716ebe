"""Search spaces: enumeration, membership, neighbourhoods, subspaces, built from knobs files."""
from __future__ import annotations

import collections
import itertools
import random

import pytest

from colibri_build.render import KnobError, load_knob_spec, template_names
from tuner.search.space import Space

ALL_ISAS = ["avx512", "avx2", "portable", "scalar"]

# A knobs file of the shape of templates/expert_ffn.knobs.yaml (decode block knobs),
# fixed here so that the numbers below do not move when the real template evolves.
KNOBS_YAML = """\
knobs:
  isa:
    values: [scalar, portable, avx2, avx512]
    default: portable
    class: block
    domain: {paths: [decode], dtypes: [f32]}
  rows:
    values: [1, 2, 4]
    default: 2
    class: block
    domain: {paths: [decode], dtypes: [f32]}
  tok_block:
    values: [1, 2, 4]
    default: 2
    class: block
    domain: {paths: [decode], dtypes: [f32]}
  unroll:
    values: [1, 2, 4]
    default: 2
    class: block
    domain: {paths: [decode], dtypes: [f32]}
  prefetch:
    values: [0, 256, 512, 1024, 2048]
    default: 512
    class: block
    domain: {paths: [decode], dtypes: [f32]}
constraints:
  - rows * tok_block * unroll <= 16
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    d = tmp_path_factory.mktemp("templates")
    (d / "ffn.c.j2").write_text("/* {{ isa }} */\n")
    (d / "ffn.knobs.yaml").write_text(KNOBS_YAML)
    return load_knob_spec("ffn", d)


@pytest.fixture(scope="module")
def ffn(spec) -> Space:
    return Space.from_spec(spec, ALL_ISAS)


def brute_force(spec, isas, cut=None):
    names = list(spec.knobs)
    cut = cut or {}
    values = [isas if n == "isa" else cut.get(n, list(spec.knobs[n].values)) for n in names]
    return [dict(zip(names, v)) for v in itertools.product(*values)
            if not spec.violated(dict(zip(names, v)))]


def test_from_spec_matches_a_brute_force_enumeration(spec, ffn):
    expected = brute_force(spec, ALL_ISAS)
    assert ffn.points() == expected
    assert ffn.size() == len(expected) == 460      # 4 isas x 23 (rows, tok_block, unroll) x 5
    assert all(p["rows"] * p["tok_block"] * p["unroll"] <= 16 for p in ffn.points())
    assert ffn.categorical == {"isa"}
    assert ffn.default == {n: k.default for n, k in spec.knobs.items()}
    assert ffn.name == "ffn"


@pytest.mark.parametrize("template", template_names())
def test_every_real_template_gives_a_consistent_space(template):
    spec = load_knob_spec(template)
    isas = ["avx2", "portable"]
    # the full product runs to billions of points (the tuner only ever enumerates one
    # class's subspace), and even two values for every knob is 2^26: two values for the
    # knobs the constraints couple and the first others up to 2^16 points, one value for
    # the rest, keeps the brute-force check exhaustive and small
    names = [n for n in spec.knobs if n != "isa"]
    coupled = [n for n in names if any(n in c for c in spec.constraints)]
    two = set(coupled + [n for n in names if n not in coupled][:max(0, 16 - len(coupled))])
    cut = {n: list(spec.knobs[n].values[:2 if n in two else 1]) for n in names}
    space = Space.from_spec(spec, isas, overrides=cut)
    assert space.size() == len(brute_force(spec, isas, cut)) > 0
    # each points() list (a dict per point) built once, not once per point and knob
    points, rest = space.points(), list(spec.knobs)[1:]
    sub = space.subspace(**{n: [points[0][n]] for n in rest})
    sub_points = sub.points()
    first = sub_points[0]
    assert sub_points == [p for p in points if all(p[n] == first[n] for n in rest)]
    assert all(space.contains(q) for q in space.neighbours(points[-1]))


def test_profile_isas_cut_and_order_the_isa_knob(spec):
    s = Space.from_spec(spec, ["avx2", "portable", "scalar"])
    assert s.knobs["isa"] == ("avx2", "portable", "scalar")
    assert s.size() == 3 * 115
    s = Space.from_spec(spec, ["portable", "scalar"], overrides={"prefetch": [0, 512]},
                        default={"isa": "scalar", "rows": 1, "tok_block": 1, "unroll": 1, "prefetch": 0})
    assert s.knobs["prefetch"] == (0, 512) and s.size() == 2 * 23 * 2
    assert s.default["isa"] == "scalar"
    with pytest.raises(KnobError):
        Space.from_spec(spec, ALL_ISAS, overrides={"rows": [3]})
    with pytest.raises(ValueError, match="no values"):
        Space.from_spec(spec, ["neon"])


def test_points_are_deterministic_with_the_last_knob_fastest():
    s = Space(knobs={"a": (1, 2), "b": ("x", "y", "z")})
    assert [tuple(p.values()) for p in s.points()] == [
        (1, "x"), (1, "y"), (1, "z"), (2, "x"), (2, "y"), (2, "z")]
    assert s.points() == Space(knobs={"a": [1, 2], "b": ["x", "y", "z"]}).points()
    assert [s.index(p) for p in s.points()] == list(range(6))


def test_contains_and_why_not(ffn):
    p = ffn.points()[17]
    assert ffn.contains(p) and p in ffn
    assert ffn.why_not({**p, "rows": 3}).startswith("rows=3 not in")
    assert "constraint violated" in ffn.why_not({**p, "rows": 4, "tok_block": 4, "unroll": 2})
    assert "missing" in ffn.why_not({k: v for k, v in p.items() if k != "isa"})
    assert "unknown" in ffn.why_not({**p, "threads": 2})
    assert not ffn.contains("isa=avx2")


def test_string_and_callable_constraints():
    s = Space(knobs={"rows": (1, 2, 4), "unroll": (1, 2, 4)},
              constraints=["rows * unroll <= 4", lambda p: not (p["rows"] == 1 and p["unroll"] == 4)])
    assert s.size() == 5
    assert not s.contains({"rows": 1, "unroll": 4}) and s.contains({"rows": 2, "unroll": 2})
    with pytest.raises(KnobError, match="only"):
        Space(knobs={"rows": (1, 2)}, constraints=["__import__('os').system('true')"])
    with pytest.raises(KnobError, match="not a knob"):
        Space(knobs={"rows": (1, 2)}, constraints=["cols < 2"])
    with pytest.raises(ValueError, match="default"):
        Space(knobs={"rows": (1, 2)}, constraints=["rows < 2"], default={"rows": 2})
    with pytest.raises(ValueError, match="repeats"):
        Space(knobs={"rows": (1, 1)})


def test_random_point_is_valid_uniform_and_seeded(ffn):
    rng = random.Random(5)
    draws = [ffn.random_point(rng) for _ in range(4600)]
    assert all(ffn.contains(p) for p in draws)
    counts = collections.Counter(ffn.index(p) for p in draws)
    assert len(counts) > 440                    # nearly every point drawn (mean 10 draws each)
    assert max(counts.values()) < 30
    assert [ffn.random_point(random.Random(9)) for _ in range(3)] == \
           [ffn.random_point(random.Random(9)) for _ in range(3)]


def test_neighbours_move_one_knob_adjacent_or_any_other_category(ffn):
    p = {"isa": "avx2", "rows": 2, "tok_block": 1, "unroll": 2, "prefetch": 512}
    nbrs = ffn.neighbours(p)
    assert all(ffn.contains(q) for q in nbrs)
    changed = [tuple(k for k in p if p[k] != q[k]) for q in nbrs]
    assert all(len(c) == 1 for c in changed)
    by_knob = collections.defaultdict(set)
    for q, (k,) in zip(nbrs, changed):
        by_knob[k].add(q[k])
    assert by_knob == {"isa": {"avx512", "portable", "scalar"}, "rows": {1, 4},
                       "tok_block": {2}, "unroll": {1, 4}, "prefetch": {256, 1024}}
    # constraint: rows 4 x tok_block 4 x unroll 1 = 16 may not go to unroll 2
    corner = {"isa": "scalar", "rows": 4, "tok_block": 4, "unroll": 1, "prefetch": 0}
    assert {q["unroll"] for q in ffn.neighbours(corner)} == {1}
    assert {q["prefetch"] for q in ffn.neighbours(corner)} == {0, 256}


def test_neighbourhood_is_symmetric_and_connected(ffn):
    pts = ffn.points()
    nb = {ffn.index(p): {ffn.index(q) for q in ffn.neighbours(p)} for p in pts}
    assert all(i in nb[j] for i, js in nb.items() for j in js)
    seen, todo = {0}, [0]
    while todo:
        for j in nb[todo.pop()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    assert len(seen) == len(pts)


def test_subspace_restricts_and_keeps_order(ffn):
    q = ffn.subspace(isa="avx2", prefetch=[1024, 0])
    assert q.knobs["isa"] == ("avx2",) and q.knobs["prefetch"] == (0, 1024)
    assert q.size() == 23 * 2
    assert all(ffn.contains(p) for p in q.points())
    assert q.default is None                       # the template default (portable) is cut out
    assert ffn.subspace(isa="portable").default == ffn.default
    with pytest.raises(ValueError, match="unknown knob"):
        ffn.subspace(threads=2)
    with pytest.raises(ValueError, match="not in the space"):
        ffn.subspace(rows=[3])
    with pytest.raises(ValueError, match="no valid point"):
        Space(knobs={"a": (1, 2), "b": (1, 2)}, constraints=["a + b < 4"]).subspace(a=2, b=2)


def test_describe_is_plain_data(ffn):
    d = ffn.describe()
    assert d["size"] == 460 and d["constraints"] == ["rows * tok_block * unroll <= 16"]
    assert d["knobs"]["isa"] == ALL_ISAS and d["categorical"] == ["isa"]


def test_coupled_knobs_and_pair_neighbours(ffn):
    assert ffn.coupled == (("rows", "tok_block"), ("rows", "unroll"), ("tok_block", "unroll"))
    p = {"isa": "avx2", "rows": 2, "tok_block": 4, "unroll": 2, "prefetch": 512}
    pairs = ffn.pair_neighbours(p)
    assert all(ffn.contains(q) and sum(q[k] != p[k] for k in p) == 2 for q in pairs)
    assert all({k for k in p if q[k] != p[k]} <= {"rows", "tok_block", "unroll"} for q in pairs)
    # the ridge: rows up alone is invalid, but rows up with unroll down is a pair move
    assert {**p, "rows": 4} not in ffn.neighbours(p)
    assert {**p, "rows": 4, "unroll": 1} in pairs
    every = ffn.pair_neighbours(p, coupled_only=False)
    assert len(every) > len(pairs) and {**p, "isa": "scalar", "prefetch": 256} in every
    # callables could couple anything; couplings= says which pairs are
    s = Space(knobs={"a": (1, 2), "b": (1, 2), "c": (1, 2)}, constraints=[lambda q: True])
    assert s.coupled == (("a", "b"), ("a", "c"), ("b", "c"))
    s = Space(knobs={"a": (1, 2), "b": (1, 2), "c": (1, 2)}, constraints=[lambda q: True],
              couplings=[("c", "a")])
    assert s.coupled == (("a", "c"),) and s.subspace(b=1).coupled == (("a", "c"),)
    with pytest.raises(ValueError, match="couplings"):
        Space(knobs={"a": (1, 2)}, couplings=[("a", "z")])


def test_one_at_a_time_moves_one_named_knob_off_its_value_and_leaves_the_others_free(ffn):
    around = dict(ffn.default)
    q = ffn.subspace(isa="avx2").one_at_a_time(around, ["rows", "tok_block", "unroll"])
    moved = [sum(p[k] != around[k] for k in ("rows", "tok_block", "unroll")) for p in q.points()]
    assert max(moved) == 1 and moved.count(0) == len(ffn.knobs["prefetch"])  # prefetch free
    # each of the three knobs' other values alone, against every prefetch value
    assert q.size() == (1 + 2 + 2 + 2) * len(ffn.knobs["prefetch"])
    assert all(ffn.contains(p) for p in q.points())
    assert q.coupled == ffn.coupled          # the design adds no coupling for local searches
    # a product of two quick values each (4 points) becomes 3
    two = ffn.subspace(isa="avx2", rows=[2, 4], tok_block=[2, 4], unroll=[1], prefetch=[512])
    assert two.size() == 4 and two.one_at_a_time(around, ["rows", "tok_block"]).size() == 3
    with pytest.raises(ValueError, match="no point within one knob"):
        ffn.subspace(rows=[4], tok_block=[4], unroll=[1]).one_at_a_time(around, ["rows", "tok_block"])
