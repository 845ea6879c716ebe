"""colibri_bench e2e --peer llama.cpp (colibri_bench/peers/llamacpp.py): the e2e model as a
GGUF file, run by llama-cpp-python. Without the packages the command says so and exits 1;
with them (an optional extra that compiles llama.cpp), the tiny model runs beside the bench
and llama.cpp's logits agree with transformers' (a wrong tensor layout or a missing norm
would not)."""
import importlib.util
import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
HAVE_PEER = all(importlib.util.find_spec(m) for m in ("gguf", "llama_cpp"))


@pytest.mark.skipif(HAVE_PEER, reason="gguf and llama-cpp-python are installed")
def test_without_the_packages_the_command_says_what_to_install(tmp_path):
    r = subprocess.run([sys.executable, "-m", "colibri_bench", "e2e", "--shape", "tiny", "--peer", "llama.cpp",
                        "--out", str(tmp_path / "e.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "pip install gguf llama-cpp-python" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "e.json").exists()


@pytest.mark.skipif(not HAVE_PEER, reason="needs gguf and llama-cpp-python (pip install gguf llama-cpp-python)")
def test_the_tiny_model_runs_beside_and_agrees(tmp_path):
    from colibri_build.paths import build_dir_default

    out = tmp_path / "e2e.json"
    before = set(build_dir_default().glob("gguf-*"))
    r = subprocess.run([sys.executable, "-m", "colibri_bench", "e2e", "--shape", "tiny", "--layers", "2",
                        "--variant", "all:bf16", "--variant", "all:int8", "--variant", "all:int4", "--rounds", "2",
                        "--prompt-tokens", "12", "--new-tokens", "3", "--peer", "llama.cpp", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    # against the bf16 transformers model (seen: 0.006, 0.016, 0.21 on this random-init model,
    # whose q4_0 errors compound over layers); a misplaced tensor or norm reads about 1
    bound = {"BF16": 2e-2, "Q8_0": 4e-2, "Q4_0": 0.35}
    types = {}
    for v, res in data["results"].items():
        c = res["llama.cpp"]
        types[v] = c["type"]
        assert c["logits_rel_err"] <= bound[c["type"]], (v, c["logits_rel_err"])
        assert len(c["rounds"]) == 2 and c["decode_tok_s"] > 0 and c["prefill_tok_s"] > 0
        for k in ("decode", "prefill"):
            q = c["patched_over_peer"][k]
            assert q["min"] <= q["median"] <= q["max"]
    assert types == {"all:bf16": "BF16", "all:int8": "Q8_0", "all:int4": "Q4_0"}
    assert "llama.cpp beside" in r.stdout
    assert set(build_dir_default().glob("gguf-*")) == before  # the GGUF files go with the run
