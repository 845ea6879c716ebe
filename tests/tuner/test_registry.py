"""tuner merge and run --from-registry: per-machine stores combined, and a new machine
seeded from its siblings' best variants (measured here, fewer than a cold run)."""
import contextlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_build.profiles import get_profile
from tuner.store import Measurement, Store
from tuner.store.registry import merge, seed_variants

ROOT = Path(__file__).resolve().parents[2]
P1, P2 = "tiny/decode/f32", "tiny/decode/bf16"
GCC12 = {"compiler": "gcc", "compiler_version": "12.2.0", "microarchitecture": "zen4"}


def row(host, problem, rows, median, extra=GCC12, profile="zen4", status="ok"):
    knobs = {"isa": "avx512", "rows": rows}
    return Measurement(key=f"{host}|{problem}|{rows}", kernel="expert_ffn", problem=problem,
                       knobs=knobs, status=status, median_s=median if status == "ok" else None,
                       reason="" if status == "ok" else "boom", extra=dict(extra),
                       host_id=host, profile=profile)


def store_with(path, rows):
    with Store(path) as s:
        for r in rows:
            s.put(r)
    return path


def cli(*argv):
    from tuner import __main__ as main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_merge_combines_stores_and_is_idempotent(tmp_path):
    a = store_with(tmp_path / "a.sqlite", [row("a", P1, 1, 1e-3), row("a", P1, 2, 2e-3)])
    b = store_with(tmp_path / "b.sqlite", [row("b", P1, 1, 1.1e-3), row("a", P1, 2, 2e-3)])
    reg = tmp_path / "reg.sqlite"
    res = merge([a, b], reg)
    assert [s["added"] for s in res["sources"]] == [2, 1]  # b's second row is a's (same key)
    assert res["total"] == 3 and res["added"] == 3
    again = merge([a, b], reg)
    assert again["added"] == 0 and again["total"] == 3
    with Store(reg, readonly=True) as s:
        assert {m.host_id for m in s} == {"a", "b"} and s.integrity_check() == "ok"
    rc, out, err = cli("merge", str(a), str(b), "--into", str(reg))
    assert rc == 0 and f"{reg}: 3 row(s) (0 added)" in out
    rc, out, err = cli("merge", str(b), "--into", str(tmp_path / "r2.sqlite"), "--json")
    assert rc == 0 and json.loads(out)["total"] == 2


def test_merge_refuses_a_bad_source_before_writing(tmp_path):
    a = store_with(tmp_path / "a.sqlite", [row("a", P1, 1, 1e-3)])
    junk = tmp_path / "junk.sqlite"
    sqlite3.connect(junk).execute("create table t (x)").connection.commit()
    reg = tmp_path / "reg.sqlite"
    rc, out, err = cli("merge", str(a), str(junk), "--into", str(reg))
    assert rc == 1 and "not a results store" in err and not reg.exists()
    rc, out, err = cli("merge", str(a), str(tmp_path / "missing.sqlite"), "--into", str(reg))
    assert rc == 1 and "does not exist" in err and not reg.exists()

    rc, out, err = cli("run", "--from-registry", str(junk), "--store", str(tmp_path / "s.sqlite"))
    assert rc == 2 and "--from-registry" in err and "not a results store" in err
    assert not (tmp_path / "s.sqlite").exists()  # refused before anything ran
    rc, out, err = cli("run", "--from-registry", str(tmp_path / "missing.sqlite"))
    assert rc == 2 and "does not exist" in err


def test_seeds_come_from_the_same_kind_of_host_only(tmp_path):
    rows = [
        # same profile, microarchitecture, compiler major: rows=4 best, then rows=2, rows=1
        row("a", P1, 4, 1.0e-3), row("a", P2, 4, 0.5e-3),
        row("b", P1, 4, 1.2e-3), row("b", P2, 4, 0.7e-3),
        row("a", P1, 2, 2.0e-3), row("a", P2, 2, 1.0e-3),
        row("a", P1, 1, 3.0e-3), row("a", P2, 1, 1.5e-3),
        # faster, but not comparable: other compiler major, microarchitecture, profile,
        # nothing recorded, a failed row, a variant measured on one problem only
        row("c", P1, 8, 1e-6, extra=dict(GCC12, compiler_version="13.1.0")),
        row("c", P2, 8, 1e-6, extra=dict(GCC12, compiler_version="13.1.0")),
        row("d", P1, 16, 1e-6, extra=dict(GCC12, microarchitecture="zen3")),
        row("e", P1, 32, 1e-6, profile="generic"),
        row("f", P1, 64, 1e-6, extra={}),
        row("a", P1, 3, 0, status="crash"),
        row("a", P1, 5, 1e-6),
    ]
    reg = store_with(tmp_path / "reg.sqlite", rows)
    found = seed_variants(reg, kernel="expert_ffn", problems=[P1, P2], profile="zen4",
                          microarchitecture="zen4", compiler="gcc", compiler_version="12.3.0",
                          top=2)
    assert [s.knobs["rows"] for s in found["seeds"]] == [4, 2]
    best = found["seeds"][0]
    assert best.hosts == ("a", "b")
    # median over hosts per problem (2 hosts: the upper), geometric mean over problems
    assert best.cost == pytest.approx((1.2e-3 * 0.7e-3) ** 0.5)
    assert found["unmatched"] == {"other compiler or major version": 2,
                                  "other microarchitecture": 1, "other profile": 1,
                                  "no compiler/microarchitecture recorded": 1}
    # knobs another class tunes are not part of a variant here: hosts a and b pool by rows
    pooled = store_with(tmp_path / "pooled.sqlite", [
        Measurement(**{**r.__dict__, "key": r.key + "x",
                       "knobs": {**r.knobs, "prefill_rows": 1 if r.host_id == "a" else 4}})
        for r in rows[:4]])
    found = seed_variants(pooled, kernel="expert_ffn", problems=[P1, P2], profile="zen4",
                          microarchitecture="zen4", compiler="gcc", compiler_version="12",
                          ignore=("prefill_rows",))
    assert [(s.knobs, s.hosts) for s in found["seeds"]] == [({"isa": "avx512", "rows": 4}, ("a", "b"))]
    with pytest.raises(Exception, match="does not exist"):
        seed_variants(tmp_path / "nope.sqlite", kernel="expert_ffn", problems=[P1],
                      profile="zen4", microarchitecture="zen4", compiler="gcc",
                      compiler_version="12")


# ------------------------------------------------------------------ end to end

SLOW = "{ volatile int spin = 0; for (int i = 0; i < %d; i++) spin += i; }"


@pytest.fixture
def slow_templates(tmp_path):
    """templates/ with a `fault` knob whose values make the kernel slower by known
    amounts, the slow one the default: the best variant is certain, not a coin toss."""
    d = tmp_path / "templates"
    shutil.copytree(ROOT / "templates", d)
    src = (d / "expert_ffn.c.j2").read_text()
    marker = ("static void part_gateup(int dtype, const cb_mat *gate, const cb_mat *up, const float *X, "
              "int ldx,\n                        const int32_t *tok, int ntok, int r0, int r1, "
              "float *Hout, int ldh, void *ws,\n                        const void *xprep) {\n")
    assert marker in src
    inject = "".join(f'{{% if fault == "{k}" %}}    {SLOW % n}\n{{% endif %}}'
                     for k, n in (("slow", 1000000), ("slower", 3000000), ("slowest", 6000000)))
    (d / "expert_ffn.c.j2").write_text(src.replace(marker, marker + inject))
    knobs = (d / "expert_ffn.knobs.yaml").read_text().replace(
        "constraints:", "  fault:\n    values: [none, slow, slower, slowest]\n"
        "    default: slow\n    class: decode\n    domain: {paths: [decode], dtypes: [f32]}\n"
        "    doc: test-only slow-down\nconstraints:")
    (d / "expert_ffn.knobs.yaml").write_text(knobs)
    return d


# the generic profile's own prefetch distance, so the run's default lies in the space
GENERIC_PREFETCH = get_profile("generic").knobs["prefetch_f32"]


def tune(tmp_path, templates, lib, store, *extra):
    """A tuner run on `templates`, its binding on `lib` (conftest.checkout_lib: the
    templates' new mtimes do not make the checkout's default library rebuild from them)."""
    args = ["run", "--problem", P1, "--profile", "generic", "--strategy", "exhaustive", "--threads", "1",
            "--min-seconds", "0.2", "--no-bandwidth", "--no-report", "--build-dir", str(tmp_path / "build"),
            "--store", str(store), "--json", "--space", "isa=portable", "--space", "rows=2",
            "--space", "tok_block=1", "--space", "unroll=2", "--space", f"prefetch_f32={GENERIC_PREFETCH}",
            "--space", "fault=none,slow,slower,slowest", *extra]
    res = subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=900,
                         env=dict(os.environ, COLIBRI_TEMPLATES_DIR=str(templates), COLIBRI_LIB=lib))
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout), res.stderr


def test_run_from_registry_measures_fewer_and_finds_the_same_winner(tmp_path, checkout_lib,
                                                                    slow_templates):
    from colibri_build import shapes

    cold, _ = tune(tmp_path, slow_templates, checkout_lib, tmp_path / "machine-a.sqlite")
    # the winner runs for the tuned shape's class; every other shape keeps the default
    tiny = shapes.class_of(256, 128)
    assert shapes.for_class(cold["winner"]["knobs"], tiny)["fault"] == "none"
    assert cold["winner"]["knobs"]["fault"] == "slow"
    assert cold["measured_this_run"] == 4  # the default (fault=slow) is a point of the space
    reg = tmp_path / "registry.sqlite"
    assert merge([tmp_path / "machine-a.sqlite"], reg)["added"] == 4
    # a new machine of the same kind: its own empty store, the registry's best two
    warm, err = tune(tmp_path, slow_templates, checkout_lib, tmp_path / "machine-b.sqlite",
                     "--from-registry", str(reg), "--registry-top", "2")
    assert warm["measured_this_run"] < cold["measured_this_run"]
    assert warm["measured_this_run"] == 2  # the default (fault=slow, a seed too), fault=none
    assert warm["winner"]["knobs"] == cold["winner"]["knobs"]
    seeded = warm["classes"][0]["registry"]
    fault = lambda vid: dict(kv.split("=") for kv in vid.split(","))["fault"]
    assert [fault(t["vid"]) for t in seeded["taken"]] == ["none", "slow"]
    assert "seeding with 2 variant(s)" in err and "fault=none" in err
    # every seed was measured here, in this machine's store
    with Store(tmp_path / "machine-b.sqlite", readonly=True) as s:
        assert {m.knobs["fault"] for m in s} == {"none", "slow"}
