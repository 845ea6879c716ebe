"""The read settings `python -m tuner storage` leaves for this host (colibri/storage_settings.py):
Model.load applies them to a budgeted model where its caller leaves an option at its
default, never over an explicit value, and ignores a broken file with a warning."""
import json

import numpy as np
import pytest

from colibri import storage_settings
from colibri.model import Model
from colibri.modelfile import save_model


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(0)
    E, I, H = 4, 16, 32
    w = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    p = tmp_path / "m.colibri"
    save_model(p, [dict(router=w(E, H), gate=w(E, I, H), up=w(E, I, H), down=w(E, H, I), top_k=2)],
               weight_dtype="int8")
    return p


def _settings(tmp_path, monkeypatch, settings):
    f = tmp_path / "storage.json"
    f.write_text(json.dumps({"settings": settings}))
    monkeypatch.setenv("COLIBRI_STORAGE", str(f))
    return f


def test_tuned_settings_fill_the_defaults_of_a_budgeted_load(lib, tmp_path, monkeypatch, model):
    _settings(tmp_path, monkeypatch, {"io_threads": 2, "read_depth": 3, "direct_io": -1, "policy": "lfu"})
    with Model.load(model, lib=lib, memory_budget=1 << 30) as m:
        m(np.ones((4, 32), np.float32))
        st = m.stats()
    assert (st["io_threads"], st["direct_io"], st["policy"]) == (2, 0, "lfu")
    with Model.load(model, lib=lib, memory_budget=1 << 30, io_threads=1, policy="lru") as m:
        m(np.ones((4, 32), np.float32))
        st = m.stats()
    assert (st["io_threads"], st["policy"]) == (1, "lru")  # what the caller asks for wins


def test_none_and_a_missing_file_leave_the_builds_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("COLIBRI_STORAGE", "none")
    assert storage_settings.settings_path() is None and storage_settings.fill({"io_threads": 0}) == {"io_threads": 0}
    monkeypatch.setenv("COLIBRI_STORAGE", str(tmp_path / "absent.json"))
    assert storage_settings.load() == {}


@pytest.mark.parametrize("content", ["{not json", json.dumps({"settings": {"io_threads": 999}}),
                                     json.dumps({"settings": {"policy": "mru"}}), json.dumps([1])])
def test_a_broken_settings_file_is_ignored_with_a_warning(lib, tmp_path, monkeypatch, model, content):
    f = tmp_path / "storage.json"
    f.write_text(content)
    monkeypatch.setenv("COLIBRI_STORAGE", str(f))
    with pytest.warns(UserWarning, match="ignoring the storage settings"):
        with Model.load(model, lib=lib, memory_budget=1 << 30) as m:
            assert m.stats()["policy"] == "lru"
