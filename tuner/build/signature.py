"""Signatures: the identity of a measurement, and short ids of knob assignments.

A measurement (and an emitted config.h) is only reusable for the same host, the same
compiler and version, the same flags, the same template source, the same knob values
and the same problem shape (FFTW's "wisdom" rule). `signature()` hashes all of these
into one sha256 hex string; the results store is keyed by it, so a changed compiler,
flag or template gives new keys and re-measures exactly what it touches, and a
mismatch is refused rather than silently reused.

Stability: the hash is taken over a canonical JSON text (sorted keys, no whitespace,
UTF-8, tuples as lists), never over Python's hash() or dict order, so identical inputs
give identical signatures in every process and on every machine. Order is kept where
it means something: `flags` (the compiler sees them in order) and the parts of
`template_source`.

`variant_id(knobs)` is the readable id of one knob assignment, the knobs sorted by
name: "isa=avx512,prefetch=512,rows=4,tok_block=2,unroll=1". It names a variant in
logs, reports and the store's `variant` column. `variant_hash(knobs)` is a 10-hex-digit
digest of the same thing, for file and directory names.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

# Bumped when the payload layout changes: old signatures then simply stop matching.
SIGNATURE_VERSION = 1

_PLAIN = re.compile(r"[A-Za-z0-9_.+-]+")


def _normalise(value: Any, where: str) -> Any:
    """`value` as plain JSON data (dict with str keys, list, str, int, float, bool, None)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)           # IntEnum, numpy ints that subclass int
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: non-finite number {value!r} cannot be part of a signature")
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: mapping key {k!r} is not a string")
            out[k] = _normalise(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_normalise(v, f"{where}[{i}]") for i, v in enumerate(value)]
    # numpy scalars and the like: accept what converts losslessly to a plain number
    item = getattr(value, "item", None)
    if callable(item):
        return _normalise(item(), where)
    raise TypeError(f"{where}: {type(value).__name__} {value!r} is not JSON data "
                    f"(use str, int, float, bool, None, lists and str-keyed mappings)")


def canonical_json(value: Any) -> str:
    """The one text of `value` that hashing uses: sorted keys, compact, UTF-8."""
    return json.dumps(_normalise(value, "value"), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def signature_payload(*, host_fingerprint: str, compiler: str, compiler_version: str,
                      flags: Sequence[str], template_source: str | Sequence[str],
                      knobs: Mapping[str, Any], problem: Mapping[str, Any]) -> dict[str, Any]:
    """The parts `signature()` hashes, as plain data (for manifests and "what changed?").

    The template text is represented by the sha256 of each part, so the payload stays
    small enough to print; a change anywhere in a part changes its digest.
    """
    if isinstance(flags, str):
        raise TypeError("flags must be a sequence of strings, not one string")
    if isinstance(template_source, str):
        parts = [template_source]
    else:
        parts = list(template_source)
    for i, part in enumerate(parts):
        if not isinstance(part, str):
            raise TypeError(f"template_source[{i}] must be str, got {type(part).__name__}")
    for name, text in (("host_fingerprint", host_fingerprint), ("compiler", compiler),
                       ("compiler_version", compiler_version)):
        if not isinstance(text, str):
            raise TypeError(f"{name} must be str, got {type(text).__name__}")
    return {
        "version": SIGNATURE_VERSION,
        "host": host_fingerprint,
        "compiler": compiler,
        "compiler_version": compiler_version,
        "flags": _normalise(list(flags), "flags"),
        "template": [_sha256(p) for p in parts],
        "knobs": _normalise(dict(knobs), "knobs"),
        "problem": _normalise(dict(problem), "problem"),
    }


def signature(*, host_fingerprint: str, compiler: str, compiler_version: str,
              flags: Sequence[str], template_source: str | Sequence[str],
              knobs: Mapping[str, Any], problem: Mapping[str, Any]) -> str:
    """sha256 hex of everything a measurement depends on.

    `template_source`: the template text and its knobs yaml text, either as one string
    (the caller concatenated them) or as a sequence of strings (each part is hashed on
    its own, so ("ab", "c") and ("a", "bc") differ). A single string s and [s] give
    the same signature. `flags` keep their order; mappings are order-insensitive.
    """
    payload = signature_payload(host_fingerprint=host_fingerprint, compiler=compiler,
                                compiler_version=compiler_version, flags=flags,
                                template_source=template_source, knobs=knobs, problem=problem)
    return _sha256(canonical_json(payload))


def changed_parts(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Names of the payload parts that differ between two signature_payload() results."""
    return sorted(k for k in set(old) | set(new)
                  if canonical_json(old.get(k)) != canonical_json(new.get(k)))


def _value_text(value: Any) -> str:
    value = _normalise(value, "knob")
    if isinstance(value, str) and _PLAIN.fullmatch(value):
        return value
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def variant_id(knobs: Mapping[str, Any]) -> str:
    """Readable stable id of a knob assignment: "name=value,..." with names sorted.

    Integers and identifier-like strings appear as they are; anything else as JSON.
    Two assignments get the same id exactly when they are equal as knob values.
    """
    for name in knobs:
        if not isinstance(name, str) or not _PLAIN.fullmatch(name):
            raise ValueError(f"knob name {name!r} must be a plain identifier")
    return ",".join(f"{name}={_value_text(knobs[name])}" for name in sorted(knobs))


def variant_hash(knobs: Mapping[str, Any], length: int = 10) -> str:
    """Short hex digest of variant_id(knobs), for file and directory names."""
    return _sha256(variant_id(knobs))[:length]


@dataclass(frozen=True)
class BuildIdentity:
    """What every signature of one build shares: the host, the compiler and its version,
    the flags and the template source. The tuner's store keys, the emitted config.h and
    `tuner check` all sign through one of these, so they cannot assemble it differently."""
    host_fingerprint: str
    compiler: str
    compiler_version: str
    flags: tuple[str, ...]
    template_source: str

    @classmethod
    def of(cls, host_fingerprint: str, resolved, template_source: str) -> "BuildIdentity":
        """From a profile resolved by colibri_build.profiles.resolve()."""
        return cls(host_fingerprint, resolved.compiler.family, resolved.version,
                   tuple(resolved.cflags) + tuple(resolved.ldflags), template_source)

    def _args(self, knobs: Mapping[str, Any], problem: Mapping[str, Any]) -> dict[str, Any]:
        return dict(host_fingerprint=self.host_fingerprint, compiler=self.compiler,
                    compiler_version=self.compiler_version, flags=list(self.flags),
                    template_source=self.template_source, knobs=knobs, problem=problem)

    def payload(self, knobs: Mapping[str, Any], problem: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return signature_payload(**self._args(knobs, problem or {}))

    def measurement(self, knobs: Mapping[str, Any], problem: Mapping[str, Any]) -> str:
        """The store key of a measurement of `knobs` on `problem`."""
        return signature(**self._args(knobs, problem))

    def config(self, knobs: Mapping[str, Any]) -> str:
        """The config.h signature: a measurement's parts without the problem, hashed again."""
        return _sha256(signature(**self._args(knobs, {})))
