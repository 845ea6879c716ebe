"""A budgeted model's read and eviction settings as `python -m tuner storage` chose them for
this host; Model.load applies them wherever its caller leaves one at its default (0, None).

The file: <build_dir>/storage/<host-id>.json (colibri_build.hostid.storage_settings_path),
written by the tuner as {"settings": {"io_threads": .., "read_depth": .., "direct_io": ..,
"policy": "lru" | "lfu"}, ...what it was measured on}. $COLIBRI_STORAGE names another file,
or `none` for the build's defaults. A file that cannot be read or holds values out of range
is ignored with a warning: a model still loads.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

POLICIES = ("lru", "lfu")  # colibri_load_options.policy 1, 2
# each setting's range in colibri_load_options (policy: its index in POLICIES + 1)
RANGES = {"io_threads": (-1, 256), "read_depth": (0, 4096), "direct_io": (-1, 1), "policy": (0, len(POLICIES))}


def settings_path() -> Path | None:
    """The settings file in force (None: none, by $COLIBRI_STORAGE=none)."""
    env = os.environ.get("COLIBRI_STORAGE")
    if env:
        return None if env.lower() == "none" else Path(env)
    from colibri_build import hostid
    from colibri_build.paths import build_dir_default

    return hostid.storage_settings_path(build_dir_default())


def load() -> dict:
    """The tuned settings as colibri_load_options values ({} without a usable file)."""
    path = settings_path()
    if path is None or not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())["settings"]
        out = {k: POLICIES.index(v) + 1 if k == "policy" else int(v) for k, v in raw.items() if k in RANGES}
        bad = [k for k, v in out.items() if not RANGES[k][0] <= v <= RANGES[k][1]]
        if bad:
            raise ValueError(f"{', '.join(bad)} out of range")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"colibri: ignoring the storage settings {path} ({exc!r}); re-run `python -m tuner storage`",
                      stacklevel=3)
        return {}
    return out


def fill(options: dict) -> dict:
    """options (colibri_load_options values) with each one left at 0 taken from the tuned
    settings."""
    tuned = load()
    return {k: (tuned.get(k, 0) if v == 0 else v) for k, v in options.items()}
