"""tuner/context.py: what a run learns about its host before tuning."""
from types import SimpleNamespace

from tuner import context
from tuner.host import probe


def test_a_rerun_within_the_hour_reuses_the_measured_bandwidth(monkeypatch, tmp_path):
    measured = []

    def fake_probe(measure_bandwidth=True, **kw):
        measured.append(measure_bandwidth)
        return SimpleNamespace(to_dict=lambda: {
            "host_id": "h1", "fingerprint": "f1",
            "bandwidth": {"read_gbps": 30.0} if measure_bandwidth else None,
            "bandwidth_reason": None if measure_bandwidth else "not measured (--no-bandwidth)",
            "compute": {"f32": 1.0} if measure_bandwidth else None, "compute_reason": None})

    monkeypatch.setattr(probe, "probe", fake_probe)
    cfg = SimpleNamespace(measure_bandwidth=True, build_dir=tmp_path)
    said = []
    first = context._probe_host(cfg, said.append)
    assert measured == [False, True] and first["bandwidth"] == {"read_gbps": 30.0}
    measured.clear()
    again = context._probe_host(cfg, said.append)
    assert measured == [False] and again["bandwidth"] == {"read_gbps": 30.0}
    assert "reusing the bandwidth" in said[-1]
    # an hour later, or on another machine, it is measured again
    monkeypatch.setattr(context, "PROBE_REUSE_S", 0)
    measured.clear()
    context._probe_host(cfg, said.append)
    assert measured == [False, True]
