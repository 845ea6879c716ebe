"""The kernel ISA records (templates/isas.yaml): every fact about a kernel ISA in one place,
read by the profiles (arch, features), the knob spec (capabilities: which knobs change
which ISA's code), the tuner's ISA check (registers) and the compile matrix."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from .paths import ISAS_FILE as FILE, ROOT

DEFAULT_FILE = ROOT / "templates" / FILE
FIELDS = {"arch", "features", "registers", "when_feature", "capabilities", "compile_under"}


class IsaError(ValueError):
    """templates/isas.yaml is malformed."""


@dataclass(frozen=True)
class FeaturePath:
    """A library whose profile has host `feature` (where one is named), whose compiler
    predefines every one of `macros` under the build's flags (where any are named: AMX,
    which no profile requires of its hosts, shows only there) and whose knobs select this
    path (every knob = value) must contain each of `registers`."""
    feature: str
    registers: tuple[str, ...]
    knobs: tuple[tuple[str, object], ...] = ()
    macros: tuple[str, ...] = ()


@dataclass(frozen=True)
class Isa:
    name: str
    arch: str | None                                   # None: any architecture
    features: tuple[str, ...]
    registers: tuple[str, ...]
    when_feature: tuple[FeaturePath, ...]
    capabilities: dict                                  # name -> ((macro, ...), ...)
    compile_under: tuple[str, ...]

    def has(self, capability: str) -> bool:
        return capability in self.capabilities


def _strs(v, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise IsaError(f"{where} must be a list of names")
    return tuple(v)


def _record(name: str, raw, where: str) -> Isa:
    if not isinstance(raw, dict) or set(raw) - FIELDS or not {"arch", "features", "registers"} <= set(raw):
        raise IsaError(f"{where}: isa '{name}' needs a mapping with arch, features, registers "
                       f"(and optional when_feature, capabilities, compile_under)")
    caps = {}
    for cap, alts in (raw.get("capabilities") or {}).items():
        if (not isinstance(alts, list) or not alts
                or not all(isinstance(a, list) and a and all(isinstance(m, str) for m in a) for a in alts)):
            raise IsaError(f"{where}: isa '{name}' capability {cap!r} must be a list of alternatives, "
                           f"each a list of macro names, e.g. [[__AVX512VNNI__]]")
        caps[str(cap)] = tuple(tuple(a) for a in alts)
    paths = []
    for fp in raw.get("when_feature") or []:
        if (not isinstance(fp, dict) or set(fp) - {"feature", "macros", "registers", "knobs"}
                or not ({"feature", "macros"} & set(fp))):
            raise IsaError(f"{where}: isa '{name}' when_feature entries need feature or macros, "
                           f"registers (and knobs)")
        paths.append(FeaturePath(str(fp.get("feature") or ""),
                                 _strs(fp.get("registers"), f"{where}: {name} when_feature"),
                                 tuple(sorted((fp.get("knobs") or {}).items())),
                                 _strs(fp.get("macros") or [], f"{where}: {name} when_feature macros")))
    arch = raw["arch"]
    return Isa(name=name, arch=None if arch == "any" else str(arch),
               features=_strs(raw["features"], f"{where}: {name} features"),
               registers=_strs(raw["registers"], f"{where}: {name} registers"),
               when_feature=tuple(paths), capabilities=caps,
               compile_under=_strs(raw.get("compile_under") or [], f"{where}: {name} compile_under"))


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict[str, Isa]:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise IsaError(f"{path}: cannot read the ISA records: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise IsaError(f"{path}: expected a mapping of isa name -> record")
    return {str(n): _record(str(n), r, path) for n, r in raw.items()}


def records(templates_dir: str | os.PathLike | None = None) -> dict[str, Isa]:
    """name -> record, in the file's order: templates_dir's isas.yaml where it has one
    (a test's or the tuner's copy of the templates), else the repository's."""
    path = Path(templates_dir) / FILE if templates_dir is not None else DEFAULT_FILE
    return _load(str(path if path.exists() else DEFAULT_FILE))


def capability_names(recs: dict[str, Isa]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c for r in recs.values() for c in r.capabilities))
