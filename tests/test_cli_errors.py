"""Every command refuses a bad argument the same way: one line on stderr that says what
is wrong (and, for a choice, what is valid), exit status 2, never a traceback."""
import subprocess
import sys

import pytest

CASES = [
    # (module, arguments, a phrase the message must hold)
    ("colibri", ["no-such-command"], "invalid choice"),
    ("colibri", ["demo", "--threads", "-3"], ">= 1"),
    ("colibri", ["demo", "--dtype", "f64"], "choose from"),
    ("colibri", ["dump-schema"], "required"),
    ("colibri", ["convert", "a.safetensors", "--out", "m.colibri", "--weight-dtype", "f64"], "choose from"),
    ("colibri", ["generate", "--model", "m", "--prompt", "p", "--weight-dtype", "f64"], "choose from"),
    ("tuner", ["no-such-command"], "invalid choice"),
    ("tuner", ["run", "--profile", "nope"], "known: "),
    ("tuner", ["run", "--threads", "-3"], ">= 1"),
    ("tuner", ["run", "--problem", "nope/decode/f32"], "known: "),
    ("tuner", ["run", "--problem", "tiny/sideways/f32"], "known: "),
    ("tuner", ["run", "--gate-shape", "nope"], "known: "),
    ("tuner", ["run", "--shape", "nope"], "known: "),
    ("tuner", ["run", "--shape-of", "no/such/checkpoint"], "no such file or folder"),
    ("tuner", ["promote", "unused.json", "--min-artifacts", "0"], ">= 1"),
    ("tuner", ["run", "--space", "rows"], "KNOB=V1,V2"),
    ("tuner", ["run", "--min-seconds", "0"], "> 0"),
    ("tuner", ["run", "--strategy", "greedy"], "choose from"),
    ("tuner", ["ci", "--out", "unused", "--profile", "nope"], "known: "),
    ("tuner", ["ci", "--out", "unused", "--emulated"], "--emulated needs --profile"),
    ("tuner", ["probe", "--threads", "0"], ">= 1"),
    ("tuner", ["probe", "--seconds", "-1"], "> 0"),
    ("tuner", ["profiles", "no-such-profile"], "no-such-profile"),
    ("tuner", ["report", "--no-such-option"], "unrecognized"),
    ("tuner", ["check", "unused", "--rounds", "0"], ">= 1"),
    ("tuner", ["verify", "--profile", "nope"], "known: "),
    ("tuner", ["merge", "a.sqlite"], "required"),
    ("tuner", ["replay", "unused.sqlite", "--budget-fraction", "2"], "(0, 1]"),
    ("tuner", ["bench"], "colibri_bench bench"),
    ("tuner", ["storage", "--share", "1.5"], "in (0, 1]"),
    ("tuner", ["storage", "--rounds", "4,2"], "LO <= HI"),
    ("colibri_bench", ["no-such-command"], "invalid choice"),
    ("colibri_bench", ["bench", "--threads", "0"], ">= 1"),
    ("colibri_bench", ["bench", "--phase", "sideways"], "known: "),
    ("colibri_bench", ["soak", "--tokens", "0"], ">= 1"),
    ("colibri_bench", ["ab", "a.so", "b.so", "--rounds", "0"], ">= 1"),
    ("colibri_bench", ["e2e", "--layers", "0"], ">= 1"),
    ("colibri_bench", ["quant", "--rows", "0"], ">= 1"),
    ("colibri_bench", ["profile", "--seconds", "0"], "> 0"),
    ("colibri_bench", ["overhead", "--calls", "0"], ">= 1"),
    ("colibri_bench", ["offload", "--share", "1.5"], "in (0, 1]"),
    ("colibri_bench", ["cachesim", "--tokens", "0"], ">= 1"),
    ("colibri_bench", ["bench", "--beside", "int5"], "invalid choice"),
    ("colibri_bench", ["e2e", "--peer", "vllm"], "invalid choice"),
]


@pytest.mark.parametrize("module,args,phrase", CASES, ids=[" ".join([m, *a]) for m, a, _ in CASES])
def test_a_bad_argument_is_one_line_and_exit_2(module, args, phrase, tmp_path):
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert phrase in lines[0], lines[0]


def test_every_subcommand_has_a_case():
    """A new command gets a bad-argument case here."""
    import colibri.__main__ as colibri_main
    import tuner.__main__ as tuner_main
    from colibri_bench.__main__ import COMMANDS

    def subcommands(parser):
        action = next(a for a in parser._actions if a.dest == "command")
        return set(action.choices)

    covered = {(m, a[0]) for m, a, _ in CASES}
    assert {("colibri", c) for c in subcommands(colibri_main.build_parser())} <= covered
    assert {("colibri_bench", c) for c in COMMANDS} <= covered
    assert {("tuner", c) for c in subcommands(tuner_main.build_parser())} - {("tuner", "soak")} <= covered
