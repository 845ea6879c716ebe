"""The timing worker's environment (tuner/measure/worker.py): NumPy's BLAS runs the untimed
reference with one thread, so that its idle threads do not spin on the cores the timing
uses; OpenMP, which the kernels use, is left alone. Both ways of starting a worker (one
job, an interleaved session) are checked."""
import pytest

from tuner.measure import problems, worker


class _Started(Exception):
    pass


def test_both_worker_starts_give_blas_one_thread_and_leave_openmp(monkeypatch):
    envs = []

    def fake_popen(cmd, **kw):
        envs.append(kw["env"])
        raise _Started

    monkeypatch.setattr(worker.subprocess, "Popen", fake_popen)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    with pytest.raises(_Started):
        worker._spawn({"problems": []}, 1.0, None)
    s = worker.Session(["lib.so"], [problems.problem("tiny/decode/f32")], threads=[1], weights_dir=".")
    with pytest.raises(_Started):
        s.start()
    assert len(envs) == 2
    for env in envs:
        assert env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
        assert env["OMP_NUM_THREADS"] == "2" and env["PYTHONHASHSEED"] == "0"


def test_a_sigkill_is_reported_as_the_oom_killer_not_the_address_space_cap():
    import signal

    from tuner.measure import worker

    status, why = worker._exit_reason(-signal.SIGKILL, "", 4 << 30)
    assert status == worker.STATUS_CRASH
    assert "SIGKILL" in why and "OOM killer" in why and "4096 MiB" in why
    status, why = worker._exit_reason(-signal.SIGSEGV, "", 4 << 30)
    assert "SIGSEGV" in why and "OOM" not in why
