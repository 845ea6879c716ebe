"""A non-editable install works from any folder: `pip install --no-deps --target DIR .`,
then, from another folder with only DIR on the path, the binding builds its library and
runs a layer that matches the NumPy reference, and `python -m tuner run --quick` tunes
and emits. Outputs go to $COLIBRI_HOME, never into the install or the checkout."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# what a source distribution holds (build/, reports/ and .git stay behind)
SOURCES = ["pyproject.toml", "setup.py", "README.md", "SConstruct", "colibri_build", "colibri",
           "tuner", "colibri_bench", "kernels", "templates", "profiles"]

LAYER = """
import numpy as np, colibri
from colibri import reference
rng = np.random.default_rng(0)
E, H, I, T = 4, 64, 32, 5
r = rng.standard_normal((E, H), dtype=np.float32)
g, u = (rng.standard_normal((E, I, H), dtype=np.float32) * 0.1 for _ in range(2))
d = rng.standard_normal((E, H, I), dtype=np.float32) * 0.1
x = rng.standard_normal((T, H), dtype=np.float32)
y = colibri.MoELayer(r, g, u, d, top_k=2)(x)
ref = reference.moe_layer(x.astype(np.float64), r, g, u, d, top_k=2)
print(colibri.__file__)
assert np.allclose(y, ref, rtol=1e-4, atol=1e-5), np.abs(y - ref).max()
print("LAYER OK")
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(p, src / name)
    target = base / "site"
    # no build isolation: the build uses the setuptools and wheel of the test extra, and
    # needs no package index
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    shutil.rmtree(src)  # nothing may come from the sources any more
    home, work = base / "home", base / "elsewhere"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target), COLIBRI_HOME=str(home))
    for k in ("COLIBRI_LIB", "COLIBRI_BUILD_DIR", "COLIBRI_TEMPLATES_DIR"):
        env.pop(k, None)
    return target, home, work, env


def test_the_package_carries_the_engine(installed):
    target = installed[0]
    engine = target / "colibri_build" / "engine"
    assert (engine / "SConstruct").is_file() and (engine / "kernels" / "colibri.h").is_file()
    assert list((engine / "templates").rglob("*.c.j2")) and list((engine / "profiles").glob("*.yaml"))
    assert list((target / "tuner" / "report" / "templates").glob("*.j2"))


def test_the_binding_builds_and_runs_from_another_folder(installed):
    target, home, work, env = installed
    r = subprocess.run([sys.executable, "-c", LAYER], cwd=work, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "LAYER OK" in r.stdout, r.stdout + r.stderr
    assert r.stdout.splitlines()[0].startswith(str(target))  # the installed copy, not the checkout
    assert list((home / "build").glob("*/libcolibri.so"))


def test_tuner_run_quick_from_another_folder(installed):
    target, home, work, env = installed
    # the quick run on the smallest shape, one class's problem, no gate: minutes, not the
    # README's five (that full run is the main job, measured in the issue notes). The generic
    # profile: its variants build in seconds, and its decode class has code to choose on every
    # host (on zen4 the host profile's packed f32 left nothing to tune, and the emit alone
    # compiled a whole zen4 library, ~48 s); test_the_binding_builds... builds the host's
    r = subprocess.run([sys.executable, "-m", "tuner", "run", "--quick", "--profile", "generic",
                        "--problem", "tiny/decode/f32",
                        "--space", "rows=1,2", "--space", "unroll=2", "--no-gate", "--no-bandwidth"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    tuned = list((home / "build" / "tuned").glob("*/libcolibri.so"))
    assert tuned and (tuned[0].parent / "manifest.json").is_file()
    assert list((home / "reports").glob("*/report.html"))
    assert not (target / "build").exists() and not (target / "colibri_build" / "engine" / "build").exists()
