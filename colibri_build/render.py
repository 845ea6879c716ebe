"""Render kernel templates with knob values; read and write tuned config.h files.

Each template `templates/X.c.j2` declares its search space beside it in
`templates/X.knobs.yaml`: knobs (values, default, doc) and constraints (Python
expressions over knob names). Knob values are layered
    template default  <  profile `knobs:`  <  config.h
and validated (value in `values`, constraints hold, `isa` in the profile's
kernel_isas) before rendering. Rendering is strict: a name the template uses that is
not a knob is an error, never an empty string.

config.h is the tuner's output and the build's input (`scons config=...`): a
generated header carrying a signature line and one `#define COLIBRI_KNOB_<NAME>
<value>` per knob, and for each tuned shape class (colibri_build/shapes.py) one
`#define COLIBRI_SHAPE_<CLASS>_<NAME> <value>` per knob that class runs with another
value. The rendered kernels never include it; knobs reach C by rendering: the base knobs'
kernel table ("default") and one per shape class, each table one part per weight dtype
(colibri_build/parts.py). Used by SConstruct and the tuner.
"""
from __future__ import annotations

import ast
import functools
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import jinja2
import yaml

from . import isas as isas_mod, paths, shapes as shapes_mod
from .paths import KNOBS_SUFFIX, TEMPLATE_SUFFIX, TEMPLATES_DIR


def source_text(template: str, templates_dir: str | os.PathLike = TEMPLATES_DIR) -> str:
    """Everything a variant's library is built from besides its knobs and flags: the
    template, its knobs file, the partials it may pull in and the engine's C sources.
    Part of every measurement's signature, so a change to any of them re-measures
    instead of reusing old timings."""
    files = [*paths.template_sources(template, templates_dir), *paths.c_sources()]
    return "".join(f"\n/* --- {f.name} --- */\n{f.read_text()}" for f in files)


class KnobError(ValueError):
    """Knob values are invalid, or a knobs file is malformed."""


class RenderError(ValueError):
    """A template failed to render (undefined name, syntax error)."""


class ConfigError(ValueError):
    """A config.h cannot be parsed or written."""


# ---------------------------------------------------------------- knob specs

@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple
    default: Any
    doc: str = ""
    cls: str = ""                       # tuning class: knobs tuned together
    domain: "Domain | None" = None      # what the knob's code changes
    quick: tuple = ()                   # values `run --quick` tries besides the default


# Kernel paths a knob can change (tuner/measure/problems.py maps each to a problem) and the
# weight dtypes; a domain names a subset of each.
PATHS = ("decode", "prefill", "gemm")
DOMAIN_DTYPES = ("f32", "bf16", "int8", "int4")


@dataclass(frozen=True)
class Domain:
    """The kernel paths and weight dtypes whose code a knob (or a class) changes, and
    when: only for these isa values (empty: any), only where the profile's flags give
    these capabilities (templates/isas.yaml), and only for dtypes whose weights are held
    in this `layout` (the value of their `layout_<dtype>` knob; empty: any): the row
    layout's kernels never run on packed matrices, nor the packed ones on rows. `isas` is
    derived at load: the ISAs whose record has every capability in `needs` (empty: any)."""
    paths: tuple[str, ...]
    dtypes: tuple[str, ...]
    isas: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    layout: str = ""

    def cells(self) -> list[tuple[str, str]]:
        """(path, dtype) pairs, paths outer, in PATHS/DOMAIN_DTYPES order."""
        return [(p, d) for p in PATHS if p in self.paths for d in DOMAIN_DTYPES if d in self.dtypes]

    def covers(self, path: str, dtype: str) -> bool:
        return path in self.paths and dtype in self.dtypes

    def union(self, other: "Domain") -> "Domain":
        """Both domains' cells; isas, needs and layout where both knobs agree on none is any."""
        isas = () if not self.isas or not other.isas else tuple(dict.fromkeys(self.isas + other.isas))
        return Domain(paths=tuple(p for p in PATHS if p in self.paths + other.paths),
                      dtypes=tuple(d for d in DOMAIN_DTYPES if d in self.dtypes + other.dtypes),
                      isas=isas, needs=tuple(n for n in self.needs if n in other.needs),
                      layout=self.layout if self.layout == other.layout else "")

    def to_dict(self) -> dict:
        return {"paths": list(self.paths), "dtypes": list(self.dtypes), "isas": list(self.isas),
                "needs": list(self.needs), "layout": self.layout}


@dataclass(frozen=True)
class KnobSpec:
    template: str                       # template stem, e.g. "expert_ffn"
    knobs: dict[str, Knob]
    constraints: tuple[str, ...]
    path: str
    _compiled: tuple = field(default=(), repr=False, compare=False)
    # isa name -> its record (templates/isas.yaml): capabilities, with the macros that give them
    isas: dict = field(default_factory=dict, compare=False)

    @property
    def capabilities(self) -> tuple[str, ...]:
        """Every capability a knob may need: those some ISA record has."""
        return isas_mod.capability_names(self.isas)

    def classes(self) -> dict[str, tuple[str, ...]]:
        """Tuning class -> its knobs, classes in the order they first appear in the file."""
        out: dict[str, list[str]] = {}
        for name, k in self.knobs.items():
            out.setdefault(k.cls, []).append(name)
        return {c: tuple(v) for c, v in out.items()}

    def class_domain(self, cls: str) -> Domain:
        """The union of the domains of the class's knobs."""
        names = self.classes().get(cls)
        if not names:
            raise KnobError(f"{self.path}: no knob has class {cls!r}")
        dom = self.knobs[names[0]].domain
        for n in names[1:]:
            dom = dom.union(self.knobs[n].domain)
        return dom

    def violated(self, values: Mapping[str, Any]) -> list[str]:
        """The constraints `values` break (empty: all hold)."""
        env = {name: values[name] for name in self.knobs}
        return [text for text, code in zip(self.constraints, self._compiled)
                if not eval(code, {"__builtins__": {}}, env)]  # noqa: S307 - AST-checked


# Expression nodes a constraint may use: arithmetic, comparisons, boolean logic,
# literals and knob names. No calls, attributes, subscripts or comprehensions, so a
# knobs file cannot run code even though it is evaluated with eval().
_SAFE_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
    ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow,
    ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn,
    ast.IfExp, ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List,
)


def compile_constraint(text: str, names: Iterable[str], where: str = "constraint"):
    """Compile one constraint expression after checking it only uses safe syntax."""
    names = set(names)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise KnobError(f"{where}: constraint {text!r} is not a Python expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _SAFE_NODES):
            raise KnobError(f"{where}: constraint {text!r} uses {type(node).__name__}; only "
                            f"arithmetic, comparisons, and/or/not and knob names are allowed")
        if isinstance(node, ast.Name) and node.id not in names:
            raise KnobError(f"{where}: constraint {text!r} names '{node.id}', which is not a "
                            f"knob (knobs: {', '.join(sorted(names))})")
    return compile(tree, f"<{where}>", "eval")


def template_names(templates_dir: str | os.PathLike = TEMPLATES_DIR) -> list[str]:
    """Stems of every templates/*.c.j2, sorted."""
    return sorted(p.name[: -len(TEMPLATE_SUFFIX)] for p in Path(templates_dir).glob("*" + TEMPLATE_SUFFIX))


def load_knob_spec(template: str, templates_dir: str | os.PathLike = TEMPLATES_DIR) -> KnobSpec:
    """The search space declared in templates/<template>.knobs.yaml."""
    path = Path(templates_dir) / (template + KNOBS_SUFFIX)
    if not path.exists():
        raise KnobError(f"template {template}{TEMPLATE_SUFFIX} has no knobs file {path} beside it")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise KnobError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict) or set(raw) - {"knobs", "constraints"}:
        raise KnobError(f"{path}: expected a mapping with 'knobs' and optional 'constraints' "
                        f"(capabilities are the ISA records', {isas_mod.FILE})")
    try:
        records = isas_mod.records(templates_dir)
    except isas_mod.IsaError as exc:
        raise KnobError(str(exc)) from None
    knobs = {}
    for name, k in (raw.get("knobs") or {}).items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", str(name)):
            raise KnobError(f"{path}: knob name {name!r} must be lower_snake_case")
        if isinstance(k, dict) and k.get("values") == "isas":  # the ISA records' names, in order
            k = dict(k, values=list(records))
        if not isinstance(k, dict) or not isinstance(k.get("values"), list) or not k["values"]:
            raise KnobError(f"{path}: knob '{name}' needs a non-empty 'values' list")
        if k.get("default") not in k["values"]:
            raise KnobError(f"{path}: knob '{name}' default {k.get('default')!r} is not in its values {k['values']}")
        cls = k.get("class")
        if not isinstance(cls, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", cls):
            raise KnobError(f"{path}: knob '{name}' needs a 'class' (a lower_snake_case name: "
                            f"the knobs tuned together)")
        quick = k.get("quick") or []
        if not isinstance(quick, list) or any(v not in k["values"] for v in quick):
            raise KnobError(f"{path}: knob '{name}' quick {quick!r} must list some of its values {k['values']}")
        knobs[name] = Knob(name=name, values=tuple(k["values"]), default=k["default"],
                           doc=str(k.get("doc", "")), cls=cls,
                           domain=_domain(k.get("domain"), f"{path}: knob '{name}'", records),
                           quick=tuple(quick))
    for name, k in knobs.items():
        if k.domain.layout:
            lk = [knobs.get(f"layout_{d}") for d in k.domain.dtypes]
            if not any(lk) or any(x is not None and k.domain.layout not in x.values for x in lk):
                raise KnobError(f"{path}: knob '{name}' domain layout {k.domain.layout!r} is not a value of "
                                f"the layout knob of each of its dtypes (layout_<dtype>)")
    constraints = tuple(str(c) for c in raw.get("constraints") or ())
    compiled = tuple(compile_constraint(c, knobs, str(path)) for c in constraints)
    spec = KnobSpec(template=template, knobs=knobs, constraints=constraints, path=str(path),
                    _compiled=compiled, isas=records)
    defaults = {n: k.default for n, k in knobs.items()}
    if spec.violated(defaults):
        raise KnobError(f"{path}: the default knob values break {spec.violated(defaults)}")
    return spec


def _domain(raw, where: str, records: Mapping) -> Domain:
    if not isinstance(raw, dict) or set(raw) - {"paths", "dtypes", "needs", "layout"}:
        extra = (f" ('isas' is derived from 'needs' and the ISA records, {isas_mod.FILE})"
                 if isinstance(raw, dict) and "isas" in raw else "")
        raise KnobError(f"{where} needs a 'domain' mapping with 'paths' and 'dtypes' "
                        f"(and optional 'needs', 'layout'): the code the knob changes{extra}")
    parts = {}
    for key, known in (("paths", PATHS), ("dtypes", DOMAIN_DTYPES),
                       ("needs", isas_mod.capability_names(records))):
        vals = raw.get(key, [])
        if not isinstance(vals, list) or (key in ("paths", "dtypes") and not vals):
            raise KnobError(f"{where}: domain '{key}' must be a{' non-empty' if key in ('paths', 'dtypes') else ''} list")
        bad = [v for v in vals if v not in known]
        if bad:
            raise KnobError(f"{where}: domain {key} {bad} unknown (known: {', '.join(known) or 'none'})")
        parts[key] = tuple(str(v) for v in vals)
    needs = parts["needs"]
    isas = tuple(n for n, r in records.items() if all(r.has(c) for c in needs)) if needs else ()
    layout = raw.get("layout", "")
    if not isinstance(layout, str):
        raise KnobError(f"{where}: domain 'layout' must be a layout name (rows, interleaved)")
    return Domain(**parts, isas=isas, layout=layout)


def load_all_specs(templates_dir: str | os.PathLike = TEMPLATES_DIR) -> dict[str, KnobSpec]:
    return {t: load_knob_spec(t, templates_dir) for t in template_names(templates_dir)}


# ---------------------------------------------------------------- knob values

def validate_knobs(spec: KnobSpec, values: Mapping[str, Any],
                   kernel_isas: Iterable[str] | None = None, origin: str = "") -> None:
    """Raise KnobError listing every problem of a complete knob assignment."""
    problems = []
    missing = sorted(set(spec.knobs) - set(values))
    if missing:
        problems.append(f"missing knobs {missing}")
    for name, knob in spec.knobs.items():
        if name in values and values[name] not in knob.values:
            problems.append(f"{name}={values[name]!r} is not one of {list(knob.values)}")
    if kernel_isas is not None and "isa" in spec.knobs and "isa" in values:
        allowed = list(kernel_isas)
        if values["isa"] not in allowed:
            problems.append(f"isa={values['isa']!r} is not a kernel isa of the profile "
                            f"(kernel_isas: {allowed})")
    if not problems:
        problems += [f"constraint violated: {c}" for c in spec.violated(values)]
    if problems:
        shown = " ".join(f"{k}={values[k]}" for k in sorted(values) if k in spec.knobs)
        raise KnobError(f"invalid knob values for templates/{spec.template}{TEMPLATE_SUFFIX}"
                        f"{' (' + origin + ')' if origin else ''} [{shown}]: " + "; ".join(problems))


def resolve_knobs(spec: KnobSpec, profile_knobs: Mapping[str, Any] | None = None,
                  config_knobs: Mapping[str, Any] | None = None,
                  kernel_isas: Iterable[str] | None = None, origin: str = "") -> dict[str, Any]:
    """Values of spec's knobs: template default < profile < config.h; validated.

    Names in the layers that this template does not declare are ignored here (a
    profile's knobs serve every template); see unknown_knobs() for typo checks.
    """
    values = {name: k.default for name, k in spec.knobs.items()}
    for layer in (profile_knobs or {}), (config_knobs or {}):
        values.update({k: v for k, v in layer.items() if k in spec.knobs})
    validate_knobs(spec, values, kernel_isas, origin)
    return values


def unknown_knobs(specs: Mapping[str, KnobSpec], knobs: Mapping[str, Any]) -> list[str]:
    """Names in `knobs` that no template declares (typos, stale config.h)."""
    declared = {n for s in specs.values() for n in s.knobs}
    return sorted(set(knobs) - declared)


def resolve_all(specs: Mapping[str, KnobSpec], profile_knobs: Mapping[str, Any],
                config_knobs: Mapping[str, Any] | None, kernel_isas: Iterable[str],
                profile_name: str = "profile", config_path: str = "config.h") -> dict[str, dict[str, Any]]:
    """Knob values per template for one build; KnobError on any unknown or invalid value."""
    for layer, where in ((profile_knobs, f"profile '{profile_name}'"), (config_knobs or {}, config_path)):
        bad = unknown_knobs(specs, layer)
        if bad:
            declared = sorted({n for s in specs.values() for n in s.knobs})
            raise KnobError(f"{where} sets knobs no template declares: {bad} "
                            f"(declared in templates/*{KNOBS_SUFFIX}: {declared})")
    origin = f"profile '{profile_name}'" + (f" + {config_path}" if config_knobs else "")
    isas = list(kernel_isas)
    return {t: resolve_knobs(s, profile_knobs, config_knobs, isas, origin) for t, s in specs.items()}


def resolve_shapes(specs: Mapping[str, KnobSpec], profile_knobs: Mapping[str, Any],
                   config_knobs: Mapping[str, Any] | None, shapes: Mapping[str, Mapping[str, Any]],
                   kernel_isas: Iterable[str], profile_name: str = "profile",
                   config_path: str = "config.h") -> dict[str, dict[str, dict[str, Any]]]:
    """Knob values per template of each tuned shape class: the build's (profile < config.h)
    with the class's values on top, validated like them. {class: {template: knobs}}."""
    out = {}
    for cls, over in sorted((shapes or {}).items()):
        try:
            shapes_mod.parse(cls)
        except ValueError as exc:
            raise KnobError(f"{config_path}: {exc}") from None
        out[cls] = resolve_all(specs, profile_knobs, {**(config_knobs or {}), **over}, kernel_isas,
                               profile_name, f"{config_path}, shape class {cls}")
    return out


def search_space(spec: KnobSpec, kernel_isas: Iterable[str] | None = None,
                 overrides: Mapping[str, Iterable] | None = None) -> dict[str, list]:
    """Values the tuner may try per knob: the template's, cut by the profile.

    `isa` keeps only the profile's kernel_isas (in the profile's preference order);
    `overrides` (a profile's `space: {template: {knob: [...]}}`) narrows any knob.
    """
    space = {name: list(k.values) for name, k in spec.knobs.items()}
    if kernel_isas is not None and "isa" in space:
        space["isa"] = [i for i in kernel_isas if i in space["isa"]]
    for name, allowed in (overrides or {}).items():
        if name not in space:
            raise KnobError(f"space override for unknown knob '{name}' of {spec.template}")
        bad = [v for v in allowed if v not in spec.knobs[name].values]
        if bad:
            raise KnobError(f"space override {name}: {bad} not in {list(spec.knobs[name].values)}")
        space[name] = [v for v in space[name] if v in list(allowed)]
    return space


# ---------------------------------------------------------------- rendering

@functools.lru_cache(maxsize=8)
def _environment(templates_dir: str | os.PathLike) -> jinja2.Environment:
    # one per directory: it keeps the compiled templates (and reloads one whose file changed)
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,   # an unknown name is an error, not ""
        keep_trailing_newline=True,
        autoescape=False,                   # C source, not HTML
    )


def knob_summary(knobs: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={knobs[k]}" for k in sorted(knobs))


# The kernel table of a library's base knobs (a tuned shape class's table is named after
# the class, colibri_build/shapes.py); colibri_build/parts.py renders the tables' parts.
DEFAULT_TABLE = "default"
# names the renderer passes a template besides its knobs (colibri_build/parts.py)
RESERVED_NAMES = ("part", "part_symbol")


def generated_header(template: str, knobs: Mapping[str, Any], note: str | None = None) -> str:
    return (f"/* GENERATED by colibri_build/render.py from templates/{template}{TEMPLATE_SUFFIX}; "
            f"do not edit (edit the template).\n"
            + (f" * {note}\n" if note else "")
            + f" * knobs: {knob_summary(knobs)}\n */\n")


def render(template: str, knobs: Mapping[str, Any],
           templates_dir: str | os.PathLike = TEMPLATES_DIR, extra: Mapping[str, Any] | None = None,
           header: tuple[str, Mapping[str, Any]] | None = None) -> str:
    """C source of `template` rendered with `knobs` (already validated) and the renderer's
    `extra` names (RESERVED_NAMES), after a header listing `knobs` (or header's note and
    knobs)."""
    name = template + TEMPLATE_SUFFIX
    clash = [n for n in RESERVED_NAMES if n in knobs]
    if clash:
        raise RenderError(f"templates/{name}: {clash} are names the renderer passes, not knobs")
    try:
        body = _environment(templates_dir).get_template(name).render(**knobs, **(extra or {}))
    except jinja2.TemplateNotFound:
        raise RenderError(f"no template {name} in {templates_dir}") from None
    except jinja2.UndefinedError as exc:
        raise RenderError(f"templates/{name}: {exc.message}; every name a template uses must be a "
                          f"knob (given: {sorted(knobs)}) or set inside the template") from None
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"templates/{name}:{exc.lineno}: {exc.message}") from None
    note, listed = header if header else (None, knobs)
    return generated_header(template, listed, note) + body


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, text: str) -> Path:
    """Write via a temp file in the same directory + os.replace: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual 0644
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


# ---------------------------------------------------------------- config.h

@dataclass(frozen=True)
class ConfigH:
    knobs: dict[str, Any]
    signature: str | None
    profile: str | None
    path: str | None = None
    shapes: dict[str, dict[str, Any]] = field(default_factory=dict)  # class -> its knob values

    @property
    def assignment(self) -> dict[str, Any]:
        """The knobs with the shape classes' values as one knob assignment (shapes.join)."""
        return shapes_mod.join(self.knobs, self.shapes)


_DEFINE = re.compile(r"^\s*#\s*define\s+COLIBRI_KNOB_([A-Za-z0-9_]+)\s+(\S+)\s*(?:/\*.*\*/)?\s*$")
_SHAPE_DEFINE = re.compile(
    r"^\s*#\s*define\s+COLIBRI_SHAPE_(H\d+_I\d+)_([A-Za-z0-9_]+)\s+(\S+)\s*(?:/\*.*\*/)?\s*$")
_SIGNATURE = re.compile(r"/\*\s*signature:\s*([0-9a-fA-F]+)\s*\*/")
_PROFILE = re.compile(r"/\*\s*profile:\s*([A-Za-z0-9_.+-]+)\s*\*/")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"-?\d+")


def _parse_value(text: str) -> Any:
    if _INT.fullmatch(text):
        return int(text)
    if _IDENT.fullmatch(text):
        return text  # string knobs are written as bare identifiers: COLIBRI_KNOB_ISA avx512
    raise ConfigError(f"unsupported knob value {text!r} (integers and identifiers only)")


def parse_config_h(text: str, path: str | None = None) -> ConfigH:
    """Knob values, signature and profile of a config.h text."""
    where = path or "config.h"
    knobs: dict[str, Any] = {}
    shapes: dict[str, dict[str, Any]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _SHAPE_DEFINE.match(line)
        if m:
            cls, name = m.group(1).lower(), m.group(2).lower()
            if name in shapes.setdefault(cls, {}):
                raise ConfigError(f"{where}:{lineno}: COLIBRI_SHAPE_{m.group(1)}_{m.group(2)} "
                                  f"defined twice")
            try:
                shapes[cls][name] = _parse_value(m.group(3))
            except ConfigError as exc:
                raise ConfigError(f"{where}:{lineno}: {exc}") from None
            continue
        m = _DEFINE.match(line)
        if not m:
            continue
        name = m.group(1).lower()
        if name in knobs:
            raise ConfigError(f"{where}:{lineno}: COLIBRI_KNOB_{m.group(1)} defined twice")
        try:
            knobs[name] = _parse_value(m.group(2))
        except ConfigError as exc:
            raise ConfigError(f"{where}:{lineno}: {exc}") from None
    sig = _SIGNATURE.search(text)
    prof = _PROFILE.search(text)
    return ConfigH(knobs=knobs, signature=sig.group(1).lower() if sig else None,
                   profile=prof.group(1) if prof else None, path=path, shapes=shapes)


def read_config_h(path: str | os.PathLike) -> ConfigH:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror}") from None
    return parse_config_h(text, str(p.resolve()))


def _define(prefix: str, name: str, value: Any) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ConfigError(f"knob name {name!r} must be lower_snake_case")
    if isinstance(value, bool):
        value = int(value)
    if not (isinstance(value, int) or isinstance(value, str) and _IDENT.fullmatch(value)):
        raise ConfigError(f"knob {name}={value!r}: only integers and identifiers fit in config.h")
    return f"#define {prefix}{name.upper()} {value}"


def format_config_h(knobs: Mapping[str, Any], signature: str, profile: str) -> str:
    """config.h of a knob assignment (its shape classes' values included, shapes.split)."""
    if not re.fullmatch(r"[0-9a-fA-F]+", signature or ""):
        raise ConfigError(f"signature must be hex digits, got {signature!r}")
    try:
        base, shapes = shapes_mod.split(knobs)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    lines = [_define("COLIBRI_KNOB_", name, base[name]) for name in sorted(base)]
    for cls, over in shapes.items():
        lines.append(f"/* shape class {cls} ({shapes_mod.describe(cls)}): these knobs differ */")
        lines += [_define(f"COLIBRI_SHAPE_{cls.upper()}_", name, over[name]) for name in sorted(over)]
    return (
        "/* config.h - GENERATED by the Colibri tuner; do not edit (re-run the tuner).\n"
        f" * Build with: scons profile={profile} config=<this file>\n"
        " * The signature stamps host, compiler, flags, templates and knob values: a\n"
        " * mismatch is refused, never silently reused.\n"
        " */\n"
        f"/* profile: {profile} */\n"
        f"/* signature: {signature.lower()} */\n"
        "#ifndef COLIBRI_CONFIG_H\n"
        "#define COLIBRI_CONFIG_H\n"
        + "".join(line + "\n" for line in lines)
        + "#endif /* COLIBRI_CONFIG_H */\n"
    )


def write_config_h(path: str | os.PathLike, knobs: Mapping[str, Any], signature: str,
                   profile: str) -> Path:
    """Write a config.h atomically; parse_config_h() reads back the same values."""
    return atomic_write(path, format_config_h(knobs, signature, profile))
