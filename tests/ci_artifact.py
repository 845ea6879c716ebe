"""One `tuner ci` artifact made on a tiny problem and space, shared by test_ci.py and
test_check.py (made once per test process: a run builds and times real variants)."""
import contextlib
import io
import json
from pathlib import Path

PROBLEM = "tiny/decode/f32"
# this host's profile (so `check` can match), a 2-variant space, short timings: the decode
# class's block height in whichever f32 layout the profile holds (rows, or packed: zen4)
SPACE = ["isa=portable", "rows=1,2", "vec_rows_float=1,2", "tok_block=1", "unroll=2", "prefetch_f32=0",
         "vec_prefetch_f32=0"]
ROOT_MEMBERS = ("config.h", "libcolibri.so", "build_info.json", "colibri.h", "manifest.json",
                "report.html", "report.md", "results.sqlite")
_made: dict = {}


def run_ci(argv, report=None):
    """python -m tuner ci ARGV in this process: (exit status, stdout, stderr).
    `report` replaces tuner.report.write_report (None: the real one)."""
    from tuner import __main__ as cli
    from tuner.fleet import ci

    out, err = io.StringIO(), io.StringIO()
    saved = ci.report_writer
    if report is not None:
        ci.report_writer = lambda: report
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["ci", *argv])
    finally:
        ci.report_writer = saved
    return rc, out.getvalue(), err.getvalue()


def ci_args(root: Path) -> list[str]:
    args = ["--out", str(root / "out"), "--quick", "--problem", PROBLEM, "--min-seconds", "0.05",
            "--no-bandwidth", "--strategy", "exhaustive", "--build-dir", str(root / "build"),
            "--store", str(root / "store.sqlite"), "--json"]
    for s in SPACE:
        args += ["--space", s]
    return args


def artifact(tmp_path_factory) -> dict:
    """{"root", "args", "result" (the --json object), "stderr"}; made on first use."""
    if not _made:
        root = tmp_path_factory.mktemp("ci")
        args = ci_args(root)
        rc, out, err = run_ci(args)
        assert rc == 0, err[-4000:]
        _made.update(root=root, args=args, result=json.loads(out), stderr=err)
    return _made
