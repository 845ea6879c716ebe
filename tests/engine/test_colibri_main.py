"""python -m colibri (colibri/__main__.py): the command-line conventions shared with
python -m tuner: --help on every command with its exit codes, --json where the output
is data, usage errors exit 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from moe_data import make_case

from colibri.__main__ import build_parser
from colibri.modelfile import save_model

ROOT = Path(__file__).resolve().parents[2]


def python_m(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "colibri", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def subcommands() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return list(sub.choices)


def test_every_command_is_listed():
    assert {"dump-schema", "demo", "convert"} <= set(subcommands())


@pytest.mark.parametrize("command", subcommands())
def test_help_of_every_command(command):
    r = python_m(command, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m colibri " + command)
    assert "Exit status: 0 " in r.stdout and "2 usage error" in r.stdout


def test_top_level_help_and_usage_error():
    r = python_m("--help")
    assert r.returncode == 0 and "Exit status" in r.stdout
    for c in subcommands():
        assert c in r.stdout
    r = python_m("no-such-command")
    assert r.returncode == 2 and "invalid choice" in r.stderr and "dump-schema" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_data_commands_have_json():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for c in ("dump-schema", "demo", "convert"):
        assert "--json" in sub.choices[c]._option_string_actions, c


def test_dump_schema_json(tmp_path, lib):
    case = make_case(16, 8, 4, 2, seed=2)
    p = tmp_path / "m.colibri"
    save_model(p, [dict(router=case.router, gate=case.gate, up=case.up, down=case.down, top_k=2)])
    r = python_m("dump-schema", "--json", p)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["valid"] is True and d["error"] is None and d["file"] == str(p)
    assert (d["n_layers"], d["hidden"], d["inter"], d["n_experts"]) == (1, 16, 8, 4)
    assert len(d["tensors"]) == d["n_tensors"] == 1 + 3 * 4
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0xFF  # the last payload's CRC no longer matches
    p.write_bytes(bytes(raw))
    r = python_m("dump-schema", "--json", p)
    d = json.loads(r.stdout)
    assert r.returncode == 1 and d["valid"] is False and "crc32" in d["error"].lower()


def test_demo_json(monkeypatch, lib, capsys):
    """demo --json prints one JSON object (a tiny shape here: the real one needs 5 GB)."""
    from colibri import demo

    monkeypatch.setattr(demo, "SHAPE", dict(H=32, I=16, E=4, k=2))
    assert demo.main(threads=1, as_json=True) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] is True and d["threads"] == 1 and d["shape"]["E"] == 4
    assert [r["dtype"] for r in d["results"]] == list(demo.DEFAULT_DTYPES)
    assert all(r["max_rel_err"] < 1e-4 and r["decode_ms"] > 0 for r in d["results"])
