"""tuner/report/__init__.py and `python -m tuner report`: the page and the Markdown built from the
recorded store (tests/fixtures/stores/expert_ffn-emr-vm.sqlite) plus a synthetic tuned
directory; missing inputs; a plot that fails; the page opened in headless Chromium."""
import base64
import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_build import render
from tuner import report
from tuner.build.signature import variant_id
from tuner.host import probe
from tuner.store import Measurement, Store

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "tests" / "fixtures" / "stores" / "expert_ffn-emr-vm.sqlite"
HOST_TREE = ROOT / "tests" / "fixtures" / "hosts" / "emr-vm-2vcpu"
DECODE = "qwen3-30b-a3b/decode/f32"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SIG = "ab12" * 16
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


def _store_rows():
    with Store(STORE, readonly=True) as st:
        return st.query()


@pytest.fixture(scope="module")
def host_lib():
    """This host's default library and its build_info.json (built on first use)."""
    from colibri._lib import build_profile
    from colibri_build.paths import build_dir_default
    from colibri_build import hostid

    lib = build_dir_default() / hostid.host_profile_name() / "libcolibri.so"
    if not lib.exists():
        build_profile(hostid.host_profile_name(), quiet=True)
    return lib


def make_tuned_dir(d: Path, lib: Path | None) -> dict:
    """A tuned directory as tuner/build/emit.py writes it, the winner and default taken from
    the recorded store; the library (if given) is this host's default build."""
    d.mkdir(parents=True, exist_ok=True)
    ok = sorted((m for m in _store_rows() if m.ok), key=lambda m: m.median_s)
    win, dflt = ok[0], ok[len(ok) // 2]
    knobs = dict(win.knobs)
    if lib is not None:
        shutil.copy(lib, d / "libcolibri.so")
        shutil.copy(lib.with_name("build_info.json"), d / "build_info.json")
        knobs["isa"] = json.loads((d / "build_info.json").read_text())["kernel_isa"]
    host = probe.probe(root=str(HOST_TREE), measure_bandwidth=False).to_dict()
    host["bandwidth"] = {"read": {"1": 14.5, "2": 19.0}, "triad": {"1": 11.0, "2": 15.5},
                         "read_gbps": 19.0}
    render.write_config_h(d / "config.h", knobs, signature=SIG, profile="sapphirerapids")
    manifest = {
        "generated_by": "test", "signature": SIG, "host": host, "profile": "sapphirerapids",
        "compiler": {"family": "gcc", "version": "12.2.0", "path": "/usr/bin/gcc"},
        "cflags": ["-O3", "-march=sapphirerapids"], "ldflags": ["-fopenmp"],
        "notes": ["a test note"], "knobs": knobs,
        "summary": {
            "strategy": "exhaustive", "space_size": 276, "evaluations": 276,
            "winner": {"knobs": knobs, "vid": variant_id(knobs), "is_default": False},
            "default": {"knobs": dflt.knobs},
            "classes": [{"class": "decode", "problems": [DECODE], "strategy": "exhaustive",
                         "space_size": 276, "evaluations": 276, "default": dflt.knobs,
                         "winner": {"knobs": knobs, "vid": variant_id(knobs), "is_default": False}}],
            "rows": [{"problem": DECODE, "class": "decode", "default_s": dflt.median_s,
                      "tuned_s": win.median_s, "speedup": dflt.median_s / win.median_s,
                      "gbps": win.gbps, "bw_fraction": win.bw_fraction, "gflops": 7.7}],
            "failed": [], "read_bandwidth_gbps": 14.5, "store": str(STORE)},
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    return {"winner": win, "default": dflt, "knobs": knobs, "manifest": manifest}


def write_bench(path: Path) -> None:
    rows = []
    for impl, s in (("colibri-default", 0.012), ("colibri-tuned", 0.0098), ("numpy", 0.05)):
        rows.append({"case": DECODE, "threads": 2, "impl": impl, "seconds": s,
                     "ms_per_token": s * 1e3, "gbps": 0.151 / s, "read_bw_gbps": 19.0,
                     "pct_of_roof": 100 * 0.151 / s / 19.0, "roof_by": "read bw",
                     "gflops": 7.0, "vs_numpy": 0.05 / s, "vs_torch": None})
        rows.append({"case": "tiny/prefill16/f32", "threads": 2, "impl": impl, "seconds": 4 * s,
                     "ms_per_token": s * 250, "gbps": None, "read_bw_gbps": 19.0,
                     "pct_of_roof": 100 * 0.002 / s, "roof_by": "f32_fma", "gflops": 40.0,
                     "vs_numpy": 0.05 / s, "vs_torch": None})
    path.write_text(json.dumps({"host_id": "x", "rows": rows}))


@pytest.fixture(scope="module")
def full(tmp_path_factory, host_lib):
    tmp = tmp_path_factory.mktemp("report")
    info = make_tuned_dir(tmp / "tuned", host_lib)
    out = tmp / "out"
    out.mkdir()
    write_bench(out / "bench.json")
    res = report.write_report(STORE, tmp / "tuned", out)
    return {"res": res, "info": info, "out": out, "html": res["html"].read_text(),
            "md": res["md"].read_text()}


def _imgs(page: str) -> list[str]:
    return re.findall(r'<img src="([^"]*)"', page)


def _text(page: str) -> str:
    """The page's text with tags dropped (to look for values, not markup)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)).replace("&#39;", "'")


def test_every_plot_is_embedded_as_a_png(full):
    res, page = full["res"], full["html"]
    assert res["errors"] == []
    srcs = _imgs(page)
    assert len(srcs) == len(report.PLOTS) == 5
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    for name, *_ in report.PLOTS:
        assert f'id="plot-{name}"' in page
        png = res["plots"][name]
        assert png is not None and png.read_bytes().startswith(PNG_MAGIC)
        assert f"](report-{name}.png)" in full["md"]      # the Markdown links the files beside it


def test_page_is_self_contained(full):
    page = full["html"]
    assert "<script" not in page.lower()
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<link" not in page.lower() and "@import" not in page


def test_winner_knobs_and_default_vs_tuned(full):
    page, md, info = _text(full["html"]), full["md"], full["info"]
    table = re.search(r'<table id="winner-knobs">(.*?)</table>', full["html"], re.S).group(1)
    for k, v in info["knobs"].items():
        assert f"<th>{k}</th>" in table and f"<code>{v}</code>" in table
    assert variant_id(info["knobs"]) in page
    speedup = info["default"].median_s / info["winner"].median_s
    assert f"{speedup:.2f}x" in page
    assert f"{info['winner'].median_s * 1e3:.3f}" in md
    # the store's own best per problem, with its variant
    assert variant_id(info["winner"].knobs) in re.search(r'<table id="store-best">(.*?)</table>',
                                                         full["html"], re.S).group(1)


def test_failed_variants_with_reasons(full):
    page = full["html"]
    failed = [m for m in _store_rows() if not m.ok]
    assert len(failed) == 4
    assert "4 failed measurement(s): compile_error 4" in _text(page)
    table = re.search(r'<table id="failed-variants">(.*?)</table>', page, re.S).group(1)
    for m in failed:
        assert m.variant in table
        assert m.reason.splitlines()[-1][:60] in table.replace("&#39;", "'")
    assert table.count("compile_error") == 4


def test_host_summary(full):
    t = _text(full["html"])
    for needle in ("sapphirerapids", "cpuid-table", "why this profile", "L3 300 MiB (shared by 2 CPUs)", "L1d 48 KiB", "NUMA",
                   "1 node(s)", "THP", "huge pages", "memory channels", "read 1: 14.5, 2: 19.0",
                   "triad", "gcc 12.2.0", "-march=sapphirerapids", "a test note",
                   "avx512f"):
        assert needle in t, needle


def test_signature_and_isa_check(full):
    t = _text(full["html"])
    assert SIG in t and "The signatures agree" in t
    check = full["res"]["isa_check"]
    assert check is not None and check["ok"] is True, check
    assert "ISA check" in t and "OK" in t and check["message"] in t


def test_bench_json_is_shown(full):
    t = _text(full["html"])
    assert "Benchmark (colibri_bench bench)" in t and "colibri-tuned" in t and "numpy" in t


def test_convergence_follows_store_order_per_strategy(tmp_path):
    st = Store(tmp_path / "s.sqlite")
    times = [("exhaustive", 3.0, "ok"), ("tpe", 5.0, "ok"), ("exhaustive", 4.0, "ok"),
             ("exhaustive", None, "crash"), ("tpe", 2.0, "ok"), ("exhaustive", 1.0, "ok")]
    for i, (strat, t, status) in enumerate(times):
        st.put(Measurement(key=f"k{i}", kernel="expert_ffn", problem=DECODE, knobs={"rows": i},
                           status=status, reason="" if status == "ok" else "SIGSEGV",
                           median_s=t, samples=3 if t else 0, extra={"strategy": strat},
                           created=1000.0 + i))
    st.close()
    inp = report.load_inputs(tmp_path / "s.sqlite", None, None)
    series = report.convergence(inp)[("expert_ffn", DECODE)]
    assert list(series) == ["exhaustive", "tpe"]
    assert series["exhaustive"] == [3.0, 3.0, 3.0, 1.0]   # the crash counts, keeps the best
    assert series["tpe"] == [5.0, 2.0]


def test_throughput_decode_against_bandwidth_and_prefill_gflops(tmp_path):
    from tuner.measure import problems

    prefill = "qwen3-30b-a3b/prefill64/f32"
    with Store(tmp_path / "s.sqlite") as st:
        for i, t in enumerate((0.010, 0.020)):
            st.put(Measurement(key=f"d{i}", kernel="expert_ffn", problem=DECODE, knobs={"rows": i},
                               status="ok", median_s=t, samples=3, gbps=0.15 / t,
                               bw_fraction=0.15 / t / 20.0, created=1.0 + i))
            st.put(Measurement(key=f"p{i}", kernel="expert_ffn", problem=prefill, knobs={"rows": i},
                               status="ok", median_s=t * 100, samples=3, created=3.0 + i))
    inp = report.load_inputs(tmp_path / "s.sqlite", None, None)
    tp = report.throughput(inp)
    assert tp["decode"][DECODE] == pytest.approx([15.0, 7.5])
    assert tp["bw"][0] == pytest.approx(20.0) and "bw_fraction" in tp["bw"][1]
    flops = problems.problem(prefill).flops
    assert tp["prefill"][prefill] == pytest.approx([flops / 1.0 / 1e9, flops / 2.0 / 1e9])
    assert tp["prefill_bound"][prefill] > tp["prefill"][prefill][0]
    res = report.write_report(tmp_path / "s.sqlite", None, tmp_path / "out")
    assert res["plots"]["throughput"] is not None and res["errors"] == []


def test_rows_of_other_hosts_are_left_out(tmp_path):
    merged = tmp_path / "merged.sqlite"
    with Store(merged) as st:
        st.merge_from(STORE)
        st.put(Measurement(key="other", kernel="expert_ffn", problem=DECODE, knobs={"rows": 9},
                           status="ok", median_s=1e-6, samples=3, host_id="elsewhere-0"))
    info = make_tuned_dir(tmp_path / "tuned", None)
    res = report.write_report(merged, tmp_path / "tuned", tmp_path / "out")
    page = res["html"].read_text()
    assert "1 left out" in page and "rows=9" not in page
    assert variant_id(info["winner"].knobs) in page


def test_missing_inputs_give_a_page_that_says_so(tmp_path):
    res = report.write_report(tmp_path / "no-store.sqlite", tmp_path / "no-tuned", tmp_path / "out")
    page = _text(res["html"].read_text())
    assert res["errors"] == [] and res["isa_check"] is None
    assert "Missing inputs" in page
    for what in ("results store", "manifest", "config.h", "tuned library", "bench.json"):
        assert what in dict(res["missing"]), what
    assert "does not exist" in page and "No tuned library to disassemble" in page
    assert _imgs(res["html"].read_text()) == []
    assert "no measurements in the store" in page
    # an empty store (created, nothing measured) is named as such too
    Store(tmp_path / "empty.sqlite").close()
    res = report.write_report(tmp_path / "empty.sqlite", tmp_path / "no-tuned", tmp_path / "out2")
    assert "holds no measurements" in _text(res["html"].read_text())


def test_malformed_inputs_are_named_not_crashed(tmp_path):
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not an SQLite database" * 100)
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    (tuned / "manifest.json").write_text(json.dumps(
        {"host": "not a dict", "knobs": [1, 2], "summary": {"rows": ["x"], "classes": 3}}))
    tuned2 = tmp_path / "tuned2"
    tuned2.mkdir()
    (tuned2 / "manifest.json").write_text(json.dumps(
        {"summary": {"rows": [{"problem": DECODE, "tuned_s": "fast"}, {}]}}))
    bench2 = tmp_path / "bench2.json"
    bench2.write_text(json.dumps({"rows": [{"case": DECODE}, 7]}))
    res = report.write_report(STORE, tuned2, tmp_path / "out2", bench_json=bench2)
    page = _text(res["html"].read_text())
    assert "fast" in page and res["plots"]["convergence"] is not None
    # the default-vs-tuned plot cannot use these rows: it says so, the rest is there
    assert [e.split(":")[0] for e in res["errors"]] == ["default-vs-tuned"]
    (tuned / "build_info.json").write_text("{ truncated")
    (tuned / "config.h").write_text("#define COLIBRI_KNOB_ROWS\n")
    (tuned / "libcolibri.so").write_text("not a library")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": "nope"}))
    res = report.write_report(garbage, tuned, tmp_path / "out", bench_json=bench)
    missing = dict(res["missing"])
    assert str(garbage) in missing["results store"]
    assert "unreadable" in missing["build info"]
    assert res["isa_check"]["ok"] is None and "not an ELF file" in res["isa_check"]["message"]
    why = " | ".join(w for k, w in res["missing"] if k == "manifest")
    for key in ("host is a str", "knobs is a list", "summary.classes is a int", "summary.rows holds"):
        assert key in why, key
    assert "has no rows list" in missing["bench.json"]
    page = _text(res["html"].read_text())
    assert "Missing inputs" in page and "NOT CHECKED" in page and res["errors"] == []


def test_without_the_plotting_extra_the_page_says_so_and_is_complete(tmp_path, monkeypatch):
    def no_matplotlib(inp):
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    monkeypatch.setattr(report, "PLOTS", tuple((n, t, c, no_matplotlib) for n, t, c, _ in report.PLOTS))
    res = report.write_report(STORE, tmp_path / "none", tmp_path / "out")
    assert res["errors"] == []  # an optional extra missing is not a failed report
    page = res["html"].read_text()
    assert "matplotlib is not installed" in page and "colibri-moe[tune]" in page
    assert len(_imgs(page)) == 0


def test_a_plot_that_fails_is_reported_and_the_rest_is_written(tmp_path, monkeypatch):
    def broken(inp):
        raise ValueError("matplotlib exploded")

    plots = [(n, t, c, broken if n == "distribution" else f) for n, t, c, f in report.PLOTS]
    monkeypatch.setattr(report, "PLOTS", tuple(plots))
    res = report.write_report(STORE, tmp_path / "none", tmp_path / "out")
    assert res["errors"] == ["distribution: could not draw this plot: ValueError: matplotlib exploded"]
    page = res["html"].read_text()
    assert "matplotlib exploded" in page
    assert len(_imgs(page)) == 2          # convergence and throughput still drawn
    assert res["plots"]["distribution"] is None


def test_cli_report(tmp_path):
    cmd = [sys.executable, "-m", "tuner", "report", "--store", str(STORE), "--tuned-dir",
           str(tmp_path / "none"), "--out", str(tmp_path / "out"), "--json"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert Path(out["html"]).exists() and Path(out["md"]).exists()
    assert out["isa_check"] is None and out["errors"] == []
    assert any(m[0] == "manifest" for m in out["missing"])


def test_cli_report_unwritable_out_fails_cleanly(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = subprocess.run([sys.executable, "-m", "tuner", "report", "--store", str(STORE),
                          "--tuned-dir", str(tmp_path), "--out", str(blocker / "sub")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1
    assert "cannot write the report" in res.stderr and "Traceback" not in res.stderr


# ------------------------------------------------------------ the acceptance gate

def _gate_cell(problem, threads, median, lo, hi, **kw):
    return dict({"problem": problem, "threads": threads, "status": "ok", "default_s": 0.01,
                 "candidate_s": 0.01 / median, "median": median, "lo": lo, "hi": hi, "rounds": 3,
                 "slower": hi < 1.0 or median < 0.98, "faster": lo > 1.0, "owners": ["decode"]}, **kw)


def gate_record() -> dict:
    """A gate record as tuner/gate.py writes it: one class reverted in pass 1, the last
    pass with a faster, a slower-but-unattributed, a neutral and a crashed cell."""
    pre = "qwen3-30b-a3b/prefill512/bf16"
    first = [_gate_cell(DECODE, 1, 0.912, 0.880, 0.940)]
    last = [_gate_cell(DECODE, 1, 1.000, 0.990, 1.010),
            _gate_cell(DECODE, 2, 1.123, 1.050, 1.190),
            _gate_cell(pre, 1, 0.975, 0.950, 1.002, owners=[], note="slower outside every tuned "
                       "class's domain, within 2%: not attributed"),
            {"problem": pre, "threads": 2, "status": "crash", "reason": "SIGSEGV in expert_ffn"}]
    why = f"{DECODE} at 1 thread(s): 0.912x [0.880, 0.940]"
    return {"shapes": ["qwen3-30b-a3b", "olmoe-1b-7b"], "phases": ["decode", "prefill512"],
            "dtypes": ["f32", "bf16"], "threads": [1, 2], "rounds": 3, "min_seconds": 0.1,
            "rule": "a cell is slower when the upper bound of its 95% interval is < 1.0 or its "
                    "median ratio < 0.98",
            "passes": [{"knobs": {"rows": 8}, "vid": "rows=8", "changed": {"decode": ["rows"]},
                        "cells": first, "reverted": ["decode"]},
                       {"knobs": {"rows": 4}, "vid": "rows=4", "changed": {"prefill": ["cols"]},
                        "cells": last, "reverted": []}],
            "reverted": {"decode": {"knobs": {"rows": 8}, "cells": [why]}},
            "cells": last, "knobs": {"rows": 4}, "passed": True}


def _with_gate(d: Path, gate) -> None:
    m = json.loads((d / "manifest.json").read_text())
    if gate is ...:
        m.pop("gate", None)
    else:
        m["gate"] = gate
    (d / "manifest.json").write_text(json.dumps(m))


def _gate_section(page: str) -> str:
    return re.search(r'<h2 id="gate">(.*?)<h2 id="isa-check">', page, re.S).group(1)


def test_gate_matrix_colours_cells_and_names_reverted_classes(tmp_path):
    make_tuned_dir(tmp_path / "tuned", None)
    _with_gate(tmp_path / "tuned", gate_record())
    res = report.write_report(None, tmp_path / "tuned", tmp_path / "out")
    page = res["html"].read_text()
    sec = _gate_section(page)
    table = re.search(r'<table id="gate-matrix">(.*?)</table>', sec, re.S).group(1)
    cell = {m.group(2): m.group(1) for m in re.finditer(r'<td class="num gate-(\w+)"[^>]*>([^<]*)</td>',
                                                        table)}
    assert cell["0.975x [0.950, 1.002]"] == "slower"   # red: below the 0.98 median floor
    assert cell["1.123x [1.050, 1.190]"] == "faster"   # green: the interval lies above 1
    assert cell["1.000x [0.990, 1.010]"] == "neutral"
    assert cell["crash"] == "failed" and "SIGSEGV in expert_ffn" in table
    assert "td.gate-slower" in page                      # the class is styled (red)
    assert table.index(DECODE) < table.index("qwen3-30b-a3b/prefill512/bf16")
    text = html.unescape(_text(sec))
    assert "decode" in _text(re.search(r'<ul id="gate-reverted">(.*?)</ul>', sec, re.S).group(1))
    assert f"{DECODE} at 1 thread(s): 0.912x [0.880, 0.940]" in text
    assert "qwen3-30b-a3b, olmoe-1b-7b" in text and "median ratio < 0.98" in text
    assert "1: rows=8 (decode tuned): reverted decode" in text
    md = res["md"].read_text()
    assert "| qwen3-30b-a3b/prefill512/bf16 | 0.975x [0.950, 1.002] **SLOWER** | crash |" in md
    assert f"**decode** reverted to its defaults: {DECODE} at 1 thread(s)" in md


@pytest.mark.parametrize("gate, says", [
    (..., "predates the acceptance gate"),
    (None, "The gate was not run"),
    ({"knobs": {}, "passed": True, "note": "the candidate is the default", "passes": [],
      "cells": [], "reverted": {}, "shapes": ["tiny"], "threads": [1], "rounds": 3,
      "min_seconds": 0.1, "rule": "r"}, "the candidate is the default: no cell needed checking"),
    ("not a record", "could not be read"),
])
def test_gate_section_without_a_matrix_still_renders(tmp_path, gate, says):
    make_tuned_dir(tmp_path / "tuned", None)
    _with_gate(tmp_path / "tuned", gate)
    res = report.write_report(None, tmp_path / "tuned", tmp_path / "out")
    page = res["html"].read_text()
    assert res["errors"] == []
    assert says in _text(_gate_section(page)) and 'id="gate-matrix"' not in page
    assert "Acceptance gate" in res["md"].read_text()
    assert "No class reverted" not in page
    if gate == "not a record":  # named among the missing inputs, not a crash
        assert "gate matrix" in dict(res["missing"])


# ------------------------------------------------------------ tuner run wiring

def _fake_run(summary):
    def run(cfg, host=None):
        return dict(summary)
    return run


BASE_SUMMARY = {"host_id": "h", "profile": "generic", "strategy": "exhaustive", "evaluations": 1,
                "space_size": 1, "measured_this_run": 1, "wall_s": 1.0, "classes": [],
                "rows": [], "failed": [], "winner": {"vid": "v", "is_default": True, "knobs": {}},
                "store": "s.sqlite"}


@pytest.mark.parametrize("extra, status, message", [
    ({"isa_check": {"ok": True, "library": "l", "message": "fine"}}, 0, None),
    ({"isa_check": {"ok": False, "library": "l", "message": "promises zmm"}}, 1, "ISA CHECK FAILED"),
    ({"report": {"html": "r.html", "md": "r.md", "errors": ["throughput: boom"]}}, 1,
     "the report is incomplete"),
])
def test_run_exit_status_follows_isa_check_and_report(monkeypatch, capsys, extra, status, message):
    import tuner.__main__ as cli
    import tuner.run

    monkeypatch.setattr(tuner.run, "run", _fake_run(dict(BASE_SUMMARY, **extra)))
    assert cli.main(["run", "--quick", "--no-bandwidth"]) == status
    err = capsys.readouterr().err
    if message:
        assert message in err


def test_run_keeps_its_results_when_the_report_cannot_be_written(tmp_path):
    from tuner.run import _write_report

    class T:
        store_path = STORE
        host_id = "h"
        say = staticmethod(lambda m: None)

        class cfg:
            report_dir = tmp_path / "file" / "sub"
            build_dir = tmp_path

    (tmp_path / "file").write_text("x")
    out = _write_report(T, {"emitted": {"dir": str(tmp_path)}})
    assert out["html"] is None and out["errors"] and "Error" in out["errors"][0]
    T.cfg.report_dir = tmp_path / "ok"
    out = _write_report(T, {"emitted": {"dir": str(tmp_path)}})
    assert Path(out["html"]).exists() and out["errors"] == []


# ------------------------------------------------------------ the page in a browser

def browser_check(page: Path, tmp: Path) -> dict:
    """Open a copy of `page` in headless Chromium with a checker script; returns
    {"imgs": [{ok, w}], "errs": [...], "console": [...]}. Every console line the browser
    logs counts: the page itself has no script, so any message is an error (a failed
    resource, a blocked load, ...)."""
    copy = tmp / ("checked-" + page.name)
    checker = """<script>
window.__errs = [];
window.addEventListener("error", function (e) {
  var t = e.target; window.__errs.push(t && t.tagName ? "load failed: " + t.tagName : "error: " + e.message);
}, true);
["error", "warn"].forEach(function (k) { var f = console[k]; console[k] = function () {
  window.__errs.push(k + ": " + Array.prototype.join.call(arguments, " ")); f.apply(console, arguments); }; });
window.addEventListener("load", function () {
  var imgs = Array.prototype.map.call(document.images, function (im) {
    return {ok: im.complete && im.naturalWidth > 0, w: im.naturalWidth}; });
  var pre = document.createElement("pre"); pre.id = "__check";
  pre.textContent = JSON.stringify({imgs: imgs, errs: window.__errs});
  document.body.appendChild(pre);
});
</script>"""
    text = page.read_text()
    # first thing in <head>: it sees every error the page causes
    copy.write_text(text.replace("<head>", "<head>" + checker, 1))
    profile = tmp / f"chromium-profile-{page.stem}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
           "--dump-dom", "--virtual-time-budget=5000", copy.as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="__check">(.*?)</pre>', res.stdout, re.S)
    assert m, f"chromium did not run the checker (exit {res.returncode}):\n{res.stderr[-2000:]}"
    out = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    out["console"] = [line for line in res.stderr.splitlines() if ":CONSOLE" in line]
    return out


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                    "(scripts/setup --test installs it)")


@needs_chromium
def test_page_loads_in_chromium_with_every_image_and_no_errors(full, tmp_path):
    out = browser_check(full["res"]["html"], tmp_path)
    assert len(out["imgs"]) == 5
    assert all(i["ok"] and i["w"] > 0 for i in out["imgs"]), out
    assert out["errs"] == [] and out["console"] == [], out


@needs_chromium
def test_browser_check_catches_a_broken_image(full, tmp_path):
    page = full["res"]["html"].read_text()
    first = _imgs(page)[0]
    broken = tmp_path / "broken.html"
    broken.write_text(page.replace(first, "data:image/png;base64,iVBORw0KGgoAAAAbroken", 1))
    out = browser_check(broken, tmp_path)
    assert [i["ok"] for i in out["imgs"]] == [False] + [True] * (len(report.PLOTS) - 1)
    assert any("load failed: IMG" in e for e in out["errs"])


@needs_chromium
def test_browser_check_catches_console_errors(tmp_path):
    page = tmp_path / "noisy.html"
    page.write_text("<!DOCTYPE html><html><head><title>t</title></head><body>"
                    "<script>console.error('something broke')</script></body></html>")
    out = browser_check(page, tmp_path)
    assert "error: something broke" in out["errs"]
    assert any("something broke" in line for line in out["console"])
