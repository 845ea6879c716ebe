"""colibri/_lib.py: how the binding opens the engine library."""
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_library_stays_loaded_after_a_dlclose():
    # At interpreter exit cffi closes what it opened. Were the library unloaded, the OpenMP
    # runtime would go with it while its worker threads still spin in its code after the
    # last parallel region: a segfault at exit in some short runs. Opened RTLD_NODELETE,
    # it stays mapped through an explicit dlclose after a 2-thread call.
    code = textwrap.dedent("""
        import numpy as np
        import colibri
        from colibri import _lib
        lib = _lib.open_library()
        path = _lib.default_library_path().resolve()
        rng = np.random.default_rng(0)
        H, I, E = 64, 32, 4
        L = colibri.MoELayer(rng.standard_normal((E, H), dtype=np.float32),
                             rng.standard_normal((E, I, H), dtype=np.float32),
                             rng.standard_normal((E, I, H), dtype=np.float32),
                             rng.standard_normal((E, H, I), dtype=np.float32), top_k=2, threads=2)
        L(rng.standard_normal((3, H), dtype=np.float32))
        _lib.ffi.dlclose(lib)
        maps = open("/proc/self/maps").read()
        print("mapped" if str(path) in maps else "unmapped")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("mapped") and "unmapped" not in out.stdout, out.stdout
