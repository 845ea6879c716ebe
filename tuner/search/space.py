"""The search space of one kernel: knobs with ordered values, and constraints.

A *point* is a dict knob name -> value that gives every knob a value from its list and
satisfies every constraint. Spaces are built from a template's knobs file cut by the
profile (`Space.from_spec`, through render.search_space), or directly for tests:

    Space(knobs={"rows": (1, 2, 4), "isa": ("avx2", "portable")},
          constraints=["rows <= 2 or isa == 'avx2'"], default={"rows": 2, "isa": "avx2"})

Constraints are expression strings over knob names (checked as in the knobs files:
arithmetic, comparisons, and/or/not only) or callables taking a point and returning
a truth value.

Order matters twice: `points()` enumerates in the knobs' declared order (the last knob
varies fastest), which makes exhaustive search and replays reproducible; and
`neighbours()` moves an *ordinal* knob (all values numbers, e.g. rows, prefetch) only
to the adjacent value in its list, while a *categorical* knob (e.g. isa) may jump to
any other value. A knob is categorical when any of its values is not a number, or
when named in `categorical=`.
"""
from __future__ import annotations

import ast
import itertools
import random
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

from colibri_build.render import KnobSpec, compile_constraint, search_space

Constraint = Union[str, Callable[[Mapping[str, Any]], Any]]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True, eq=False)
class Space:
    knobs: Mapping[str, Sequence[Any]]
    constraints: Sequence[Constraint] = ()
    default: Mapping[str, Any] | None = None
    categorical: Iterable[str] | None = None
    name: str = ""
    couplings: Iterable[tuple[str, str]] | None = None
    _checks: tuple = field(default=(), init=False, repr=False)

    def __post_init__(self):
        knobs = {}
        for knob, values in dict(self.knobs).items():
            values = tuple(values)
            if not values:
                raise ValueError(f"space {self.name or ''}: knob '{knob}' has no values")
            if len(set(map(repr, values))) != len(values):
                raise ValueError(f"space {self.name or ''}: knob '{knob}' repeats a value: {values}")
            knobs[knob] = values
        object.__setattr__(self, "knobs", knobs)
        constraints = tuple(self.constraints)
        checks = []
        for c in constraints:
            if isinstance(c, str):
                code = compile_constraint(c, knobs, f"space {self.name}".strip())
                checks.append(lambda p, _code=code: eval(_code, {"__builtins__": {}}, dict(p)))  # noqa: S307
            elif callable(c):
                checks.append(c)
            else:
                raise TypeError(f"constraint {c!r} must be an expression string or a callable")
        object.__setattr__(self, "constraints", constraints)
        object.__setattr__(self, "_checks", tuple(checks))
        cat = set(self.categorical or ())
        unknown = cat - set(knobs)
        if unknown:
            raise ValueError(f"categorical names unknown knobs {sorted(unknown)}")
        cat |= {k for k, vals in knobs.items() if not all(_is_number(v) for v in vals)}
        object.__setattr__(self, "categorical", frozenset(cat))
        if self.couplings is not None:
            pairs = {tuple(p) for p in self.couplings}
            bad = [p for p in pairs if len(p) != 2 or not set(p) <= set(knobs)]
            if bad:
                raise ValueError(f"couplings name unknown knobs or are not pairs: {bad}")
            pairs |= {(b, a) for a, b in pairs}
            object.__setattr__(self, "couplings", tuple(
                p for p in itertools.combinations(knobs, 2) if p in pairs))
        if self.default is not None:
            default = dict(self.default)
            if not self.contains(default):
                raise ValueError(f"default {default} is not a point of the space: {self.why_not(default)}")
            object.__setattr__(self, "default", self.normalise(default))

    # ------------------------------------------------------------ building

    @classmethod
    def from_spec(cls, spec: KnobSpec, kernel_isas: Iterable[str] | None = None,
                  overrides: Mapping[str, Iterable] | None = None,
                  default: Mapping[str, Any] | None = None) -> "Space":
        """The space a profile lets the tuner explore for a template.

        kernel_isas: the profile's ISAs, preferred first (cuts and orders `isa`);
        overrides: the profile's per-knob cuts (`space:` in the profile YAML);
        default: the point the run starts from and compares with (usually the profile's
        resolved knob values); None takes the template's defaults when they are a point.
        """
        values = search_space(spec, kernel_isas, overrides)
        empty = [k for k, v in values.items() if not v]
        if empty:
            raise ValueError(f"space of {spec.template}: no values left for {empty} "
                             f"(kernel_isas={list(kernel_isas or [])}, overrides={dict(overrides or {})})")
        space = cls(knobs=values, constraints=spec.constraints, name=spec.template)
        if default is None:
            candidate = {n: k.default for n, k in spec.knobs.items()}
            default = candidate if space.contains(candidate) else None
        if default is not None:
            space = space.with_default(default)
        return space

    def with_default(self, default: Mapping[str, Any] | None) -> "Space":
        return Space(knobs=self.knobs, constraints=self.constraints, default=default,
                     categorical=self.categorical, name=self.name, couplings=self.couplings)

    def subspace(self, **restrict: Any) -> "Space":
        """The same space with some knobs cut to the given value(s), in this space's order.

        space.subspace(isa="avx2", prefetch=[0, 512]). The default is kept when it is
        still a point, else dropped (None).
        """
        knobs = dict(self.knobs)
        for knob, allowed in restrict.items():
            if knob not in knobs:
                raise ValueError(f"subspace: unknown knob '{knob}' (knobs: {', '.join(knobs)})")
            if isinstance(allowed, (str, bytes)) or not isinstance(allowed, Iterable):
                allowed = [allowed]
            allowed = list(allowed)
            bad = [v for v in allowed if v not in knobs[knob]]
            if bad:
                raise ValueError(f"subspace: {knob}={bad} not in the space's values {list(knobs[knob])}")
            knobs[knob] = tuple(v for v in knobs[knob] if v in allowed)
        sub = Space(knobs=knobs, constraints=self.constraints, categorical=self.categorical,
                    name=self.name, couplings=self.couplings)
        if sub.size() == 0:
            raise ValueError(f"subspace {restrict} of {self.name or 'space'} has no valid point")
        if self.default is not None and sub.contains(self.default):
            sub = sub.with_default(self.default)
        return sub

    def one_at_a_time(self, around: Mapping[str, Any], knobs: Iterable[str]) -> "Space":
        """The points that differ from `around` in at most one of `knobs` (the others are
        free as before): each value tried alone against `around`'s, not every combination
        (a one-factor-at-a-time design, linear instead of multiplicative in the values)."""
        ks = tuple(knobs)

        def one_at_a_time(p, _a=dict(around), _ks=ks):
            return sum(p[k] != _a.get(k) for k in _ks) <= 1

        sub = Space(knobs=self.knobs, constraints=(*self.constraints, one_at_a_time),
                    categorical=self.categorical, name=self.name, couplings=self.coupled)
        if sub.size() == 0:
            raise ValueError(f"{self.name or 'space'}: no point within one knob of {dict(around)}")
        return sub.with_default(self.default) if self.default is not None and sub.contains(self.default) else sub

    # ------------------------------------------------------------ points

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.knobs)

    def normalise(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """`point` as a dict in the knobs' declared order."""
        return {k: point[k] for k in self.knobs}

    def key(self, point: Mapping[str, Any]) -> tuple:
        """A hashable identity of a point (its values in declared knob order)."""
        return tuple(point[k] for k in self.knobs)

    def why_not(self, point: Mapping[str, Any]) -> str:
        """"" if point is a point of this space, else the reason."""
        if not isinstance(point, Mapping):
            return f"not a mapping: {point!r}"
        missing = [k for k in self.knobs if k not in point]
        extra = [k for k in point if k not in self.knobs]
        if missing or extra:
            return f"knobs missing {missing} / unknown {extra}"
        for k, vals in self.knobs.items():
            v = point[k]
            if v not in vals:
                return f"{k}={v!r} not in {list(vals)}"
        for c, check in zip(self.constraints, self._checks):
            try:
                ok = check(point)
            except Exception as exc:  # a constraint that cannot be evaluated rejects the point
                return f"constraint {c!r} failed to evaluate: {exc}"
            if not ok:
                return f"constraint violated: {c if isinstance(c, str) else getattr(c, '__name__', c)}"
        return ""

    def contains(self, point: Mapping[str, Any]) -> bool:
        return self.why_not(point) == ""

    __contains__ = contains

    def _valid(self, point: Mapping[str, Any]) -> bool:
        # values are known to be in range here; only the constraints remain
        index = self.__dict__.get("_index")
        if index is not None:           # points enumerated already: a lookup
            return self.key(point) in index
        try:
            return all(check(point) for check in self._checks)
        except Exception:
            return False

    @cached_property
    def _points(self) -> tuple[tuple, ...]:
        names = tuple(self.knobs)
        keys = []
        for values in itertools.product(*self.knobs.values()):
            if self._valid(dict(zip(names, values))):
                keys.append(values)
        return tuple(keys)

    @cached_property
    def _index(self) -> dict[tuple, int]:
        return {k: i for i, k in enumerate(self._points)}

    def points(self) -> list[dict[str, Any]]:
        """Every valid point, in declared order (the last knob varies fastest)."""
        names = tuple(self.knobs)
        return [dict(zip(names, k)) for k in self._points]

    def __iter__(self):
        return iter(self.points())

    def size(self) -> int:
        return len(self._points)

    def __len__(self) -> int:
        return self.size()

    def index(self, point: Mapping[str, Any]) -> int:
        """Position of a point in points(); ValueError if it is not one."""
        try:
            return self._index[self.key(point)]
        except (KeyError, TypeError):
            raise ValueError(f"not a point of the space: {self.why_not(point) or point}") from None

    def random_point(self, rng: random.Random) -> dict[str, Any]:
        """A valid point drawn uniformly."""
        if not self._points:
            raise ValueError(f"space {self.name} has no valid point")
        return dict(zip(self.knobs, self._points[rng.randrange(len(self._points))]))

    def neighbours(self, point: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Valid points that differ from `point` in one knob.

        Ordinal knobs move to the adjacent value(s) in their list; categorical knobs to
        every other value. Order: knobs in declared order, lower value first.
        """
        if not self.contains(point):
            raise ValueError(f"neighbours of a non-point: {self.why_not(point)}")
        out = []
        for knob in self.knobs:
            for v in self._moves(knob, point[knob]):
                cand = self.normalise(point)
                cand[knob] = v
                if self._valid(cand):
                    out.append(cand)
        return out

    def _moves(self, knob: str, value: Any) -> list:
        values = self.knobs[knob]
        i = values.index(value)
        if knob in self.categorical:
            return [v for j, v in enumerate(values) if j != i]
        return [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)]

    @cached_property
    def coupled(self) -> tuple[tuple[str, str], ...]:
        """Pairs of knobs that appear together in a constraint (declared order).

        `couplings=` given to the constructor wins. Otherwise a constraint given as a
        callable could couple any knobs: then every pair is.
        """
        names = list(self.knobs)
        if self.couplings is not None:
            return self.couplings
        if any(not isinstance(c, str) for c in self.constraints):
            return tuple(itertools.combinations(names, 2))
        pairs = set()
        for c in self.constraints:
            used = {n.id for n in ast.walk(ast.parse(c, mode="eval")) if isinstance(n, ast.Name)}
            pairs |= {(a, b) for a, b in itertools.combinations(names, 2) if a in used and b in used}
        return tuple(p for p in itertools.combinations(names, 2) if p in pairs)

    def pair_neighbours(self, point: Mapping[str, Any], coupled_only: bool = True) -> list[dict[str, Any]]:
        """Valid points that differ from `point` in two knobs, each moved as in neighbours().

        A constraint such as rows * unroll <= 8 can make every one-knob step from a good
        tile worse (rows up is invalid, unroll down is slower) while the two-knob trade
        (rows up, unroll down) is better: local searches use these moves to cross such
        ridges. coupled_only: only pairs of knobs that share a constraint (`coupled`).
        """
        if not self.contains(point):
            raise ValueError(f"pair_neighbours of a non-point: {self.why_not(point)}")
        pairs = self.coupled if coupled_only else itertools.combinations(list(self.knobs), 2)
        out = []
        for a, b in pairs:
            for va in self._moves(a, point[a]):
                for vb in self._moves(b, point[b]):
                    cand = self.normalise(point)
                    cand[a], cand[b] = va, vb
                    if self._valid(cand):
                        out.append(cand)
        return out

    def describe(self) -> dict[str, Any]:
        """Plain data for reports and manifests."""
        return {"name": self.name, "knobs": {k: list(v) for k, v in self.knobs.items()},
                "categorical": sorted(self.categorical),
                "constraints": [c if isinstance(c, str) else getattr(c, "__name__", "callable")
                                for c in self.constraints],
                "size": self.size(), "default": dict(self.default) if self.default else None}
