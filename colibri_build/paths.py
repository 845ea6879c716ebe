"""Where the engine's files live and where builds go.

ROOT holds SConstruct, kernels/, templates/ and profiles/: the checkout when running from
one (an editable install), else the copy `pip install .` put in this package
(colibri_build/engine/, see setup.py). Every module that reads one of those goes through
here, so the list of "the engine's sources" exists once.

Outputs (builds, tuned artifacts, reports): $COLIBRI_HOME when set; else the checkout's
build/ and reports/ when the checkout is writable; else a per-user cache folder
($XDG_CACHE_HOME/colibri, ~/.cache/colibri). $COLIBRI_BUILD_DIR still names the build
root alone.
"""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_INSTALLED = _PACKAGE / "engine"
# an installed copy has its own engine files; a checkout has them one level up
ROOT = _INSTALLED if (_INSTALLED / "SConstruct").is_file() else _PACKAGE.parent
IN_CHECKOUT = ROOT == _PACKAGE.parent
KERNELS_DIR = ROOT / "kernels"
HEADER = KERNELS_DIR / "colibri.h"
PROFILES_DIR = ROOT / "profiles"
SCONSTRUCT = ROOT / "SConstruct"
# $COLIBRI_TEMPLATES_DIR replaces the templates directory as a whole: the tuner's
# fault-injection tests point it at deliberately broken copies.
TEMPLATES_DIR = Path(os.environ.get("COLIBRI_TEMPLATES_DIR") or ROOT / "templates")
TEMPLATE_SUFFIX = ".c.j2"
KNOBS_SUFFIX = ".knobs.yaml"
ISAS_FILE = "isas.yaml"  # the kernel ISA records every template's knobs read (colibri_build/isas.py)


def home() -> Path | None:
    """Where outputs go when they do not go into the checkout (see the module docstring);
    None: into the checkout."""
    if os.environ.get("COLIBRI_HOME"):
        return Path(os.environ["COLIBRI_HOME"])
    if IN_CHECKOUT and os.access(ROOT, os.W_OK):
        return None
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "colibri"


def build_dir_default() -> Path:
    """$COLIBRI_BUILD_DIR, else <home>/build, else build/ in the checkout."""
    if os.environ.get("COLIBRI_BUILD_DIR"):
        return Path(os.environ["COLIBRI_BUILD_DIR"])
    h = home()
    return (h if h is not None else ROOT) / "build"


def reports_dir_default() -> Path:
    """Where reports and bench results go by default: <home>/reports, else reports/ in the
    checkout."""
    h = home()
    return (h if h is not None else ROOT) / "reports"


def partials(templates_dir: str | os.PathLike = TEMPLATES_DIR) -> list[Path]:
    """Template files that are not kernels themselves (shared {% include %}/{% import %}
    files, at any depth): a change to one may change every kernel."""
    tdir = Path(templates_dir)
    return sorted(f for f in tdir.rglob("*.j2") if not f.name.endswith(TEMPLATE_SUFFIX))


def c_sources() -> list[Path]:
    """The engine's hand-written C sources and headers."""
    return sorted(KERNELS_DIR.glob("*.[ch]"))


def template_sources(template: str, templates_dir: str | os.PathLike = TEMPLATES_DIR) -> list[Path]:
    """A kernel template, its knobs file, the ISA records and the partials it may pull in."""
    tdir = Path(templates_dir)
    return [tdir / f"{template}{TEMPLATE_SUFFIX}", tdir / f"{template}{KNOBS_SUFFIX}",
            *[p for p in (tdir / ISAS_FILE,) if p.exists()], *partials(tdir)]


def engine_sources(templates_dir: str | os.PathLike = TEMPLATES_DIR) -> list[Path]:
    """Everything a library is built from: SConstruct, the C sources, every template,
    knobs file and partial, the renderer that turns them into C, and the profiles (their
    flags, knobs and shape classes)."""
    tdir = Path(templates_dir)
    return [SCONSTRUCT, *c_sources(), _PACKAGE / "render.py", _PACKAGE / "parts.py",
            *sorted(tdir.glob(f"*{TEMPLATE_SUFFIX}")),
            *sorted(tdir.glob(f"*{KNOBS_SUFFIX}")), *[p for p in (tdir / ISAS_FILE,) if p.exists()],
            *partials(tdir),
            *sorted(PROFILES_DIR.glob("*.yaml"))]


def newest_source_mtime() -> float:
    """When the engine's code last changed: a library older than that may have been
    built from other code."""
    return max((f.stat().st_mtime for f in engine_sources() if f.is_file()), default=0.0)
