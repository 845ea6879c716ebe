import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# the build's read defaults for budgeted models, not settings `python -m tuner storage` left
# on this host (tests/engine/test_storage_settings.py sets its own)
os.environ.setdefault("COLIBRI_STORAGE", "none")


@pytest.fixture(scope="session")
def lib():
    """The engine library the binding picks by default (built on first use)."""
    from colibri import open_library

    return open_library()


@pytest.fixture(scope="session")
def thp_offered():
    """Whether this kernel gives transparent huge pages to a mapping that asks (THP mode
    `always` or `madvise`): where it does, an arena asking for huge pages must get them."""
    try:
        mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False
    return "[never]" not in mode
