"""`tuner promote` (tuner/fleet/promote.py): a shape class's values become the profile's
defaults only when every artifact that tuned it agrees, with the evidence in a comment and
the trimmed manifests kept; a disagreement leaves the profile as it was and says why."""
import argparse
import json
import shutil
from pathlib import Path

import yaml

from colibri_build import profiles, render, shapes
from tuner.fleet import promote

ROOT = Path(__file__).resolve().parents[2]
QWEN3, MIXTRAL = "h22_i19", "h24_i28"
_ZEN5 = profiles.get_profile("zen5")
BASE = render.resolve_knobs(render.load_knob_spec("expert_ffn"), _ZEN5.knobs, None, _ZEN5.kernel_isas)


def _manifest(host: str, per_class: dict, tuned: dict, when: float = 1.7e9,
              measured=(QWEN3, MIXTRAL)) -> dict:
    """A tuned manifest of profile zen5: per_class {shape class: knob values}, tuned {shape
    class: the knob classes the run adopted}, measured: the shape classes whose decode
    class the run measured."""
    knobs = shapes.join(dict(BASE, rows=4), per_class)
    cells = [{"problem": "qwen3-30b-a3b/decode/int8", "threads": 2, "status": "ok", "median": 1.3,
              "lo": 1.2, "hi": 1.4, "rounds": 3, "shape_class": QWEN3, "owners": ["decode"]}]
    # the run measured the decode class on both shape classes (measured: which ones)
    verdicts = [{"shape_class": sc, "class": "decode", "knobs": ["rows", "tok_block", "unroll"],
                 "winner": {"knobs": shapes.for_class(knobs, sc), "is_default": "decode" not in tuned.get(sc, [])}}
                for sc in measured]
    return {"profile": "zen5", "created": when, "host": {"host_id": host},
            "knobs": knobs, "gate": {"cells": cells},
            "summary": {"shape_classes": {sc: {"shapes": [name], "tuned_classes": tuned.get(sc, [])}
                                          for sc, name in ((QWEN3, "qwen3-30b-a3b"),
                                                           (MIXTRAL, "mixtral-8x7b"))},
                        "classes": verdicts}}


def _args(paths, pdir, **kw):
    return argparse.Namespace(artifacts=[str(p) for p in paths], profile=None, min_artifacts=2,
                              profiles_dir=str(pdir), dry_run=False, json=False, **kw)


def _setup(tmp_path, manifests):
    pdir = tmp_path / "profiles"
    shutil.copytree(ROOT / "profiles", pdir, ignore=shutil.ignore_patterns("evidence"))
    # start from zen5 without the shape classes promoted into the checked-in profile
    z = pdir / "zen5.yaml"
    z.write_text(z.read_text().split(promote.MARKER)[0].rstrip("\n") + "\n")
    paths = []
    for i, m in enumerate(manifests):
        p = tmp_path / f"m{i}.json"
        p.write_text(json.dumps(m))
        paths.append(p)
    return pdir, paths


def test_values_every_artifact_agrees_on_are_promoted_with_their_evidence(tmp_path, capsys):
    ms = [_manifest(h, {QWEN3: {"rows": 1}, MIXTRAL: {"rows": 2}},
                    {QWEN3: ["decode"], MIXTRAL: ["decode"]}) for h in ("zen5-aaaa", "zen5-bbbb")]
    ms.append(_manifest("zen5-cccc", {QWEN3: {"rows": 1}, MIXTRAL: {"rows": 4}}, {QWEN3: ["decode"]}))
    pdir, paths = _setup(tmp_path, ms)
    assert promote.main(_args(paths, pdir)) == 0
    out = capsys.readouterr().out
    text = (pdir / "zen5.yaml").read_text()
    data = yaml.safe_load(text)
    # Qwen3's class: rows=1 on all three; Mixtral's: 2, 2 and the default 4: kept, and said why
    assert data["shapes"] == {QWEN3: {"rows": 1}}
    assert "keep decode: the artifacts disagree" in out and "rows=2,tok_block=2,unroll=1 on 2" in out
    assert "zen5-aaaa" in text and "gate 1.30-1.30x" in text and "decode promoted: rows=1" in text
    assert "zen5-cccc 2023-11-14: measured decode; adopted decode, gate" in text  # Qwen3's class
    assert "zen5-cccc 2023-11-14: measured decode; adopted nothing" in text       # Mixtral's
    prof = profiles.load_registry(pdir)["zen5"]
    assert prof.shapes == {QWEN3: {"rows": 1}}
    # SConstruct builds it: the class's knobs resolve and validate like the base ones
    specs = render.load_all_specs()
    per = render.resolve_shapes(specs, prof.knobs, None, prof.shapes, prof.kernel_isas, "zen5")
    assert per[QWEN3]["expert_ffn"]["rows"] == 1
    kept = sorted((pdir / "evidence" / "zen5").glob("*.json"))
    assert len(kept) == 3 and all(json.loads(k.read_text())["evidence_of"] for k in kept)
    # promoting again from the kept evidence gives the same profile
    before = (pdir / "zen5.yaml").read_text()
    assert promote.main(_args(kept, pdir)) == 0
    assert yaml.safe_load((pdir / "zen5.yaml").read_text())["shapes"] == yaml.safe_load(before)["shapes"]
    assert (pdir / "zen5.yaml").read_text().count(promote.MARKER) == 1


def test_one_artifact_promotes_nothing_by_default(tmp_path, capsys):
    pdir, paths = _setup(tmp_path, [_manifest("zen5-aaaa", {QWEN3: {"rows": 1}}, {QWEN3: ["decode"]})])
    assert promote.main(_args(paths, pdir)) == 0
    assert "fewer than the 2 asked for" in capsys.readouterr().out
    assert profiles.load_registry(pdir)["zen5"].shapes == {}


def test_values_kept_from_an_earlier_promote_keep_their_evidence_lines(tmp_path):
    """A later promote with too few artifacts leaves the values and the earlier evidence
    lines, says why once (not once per promote), and another class's lines stay too."""
    ms = [_manifest(h, {QWEN3: {"rows": 1}, MIXTRAL: {"rows": 2}},
                    {QWEN3: ["decode"], MIXTRAL: ["decode"]}) for h in ("zen5-aaaa", "zen5-bbbb")]
    pdir, paths = _setup(tmp_path, ms)
    assert promote.main(_args(paths, pdir)) == 0
    first = (pdir / "zen5.yaml").read_text()
    assert first.count("zen5-aaaa") == 2 and "decode promoted: rows=2" in first
    _, one = _setup(tmp_path / "b", [_manifest("zen5-cccc", {QWEN3: {"rows": 1}, MIXTRAL: {"rows": 2}},
                                               {QWEN3: ["decode"]})])
    for _ in range(2):
        assert promote.main(_args(one, pdir)) == 0
        text = (pdir / "zen5.yaml").read_text()
        assert yaml.safe_load(text)["shapes"] == yaml.safe_load(first)["shapes"]
        assert text.count("zen5-aaaa") == 2 and "zen5-cccc" not in text
        assert "decode promoted: rows=1" in text and "decode promoted: rows=2" in text
        assert text.count(promote.NOT_AGAIN + "1 artifact(s), fewer than the 2 asked for") == 2
    assert set(promote.previous_comments(text)) == {QWEN3, MIXTRAL}


def test_a_value_an_artifact_only_carried_is_no_vote(tmp_path, capsys):
    """Two artifacts run Mixtral's class with rows=2 but measured only Qwen3's: nothing is
    promoted for Mixtral from them; where an earlier promote set it, it stays, marked as
    not measured by these artifacts."""
    ms = [_manifest(h, {QWEN3: {"rows": 1}, MIXTRAL: {"rows": 2}}, {QWEN3: ["decode"]},
                    measured=(QWEN3,)) for h in ("zen5-aaaa", "zen5-bbbb")]
    pdir, paths = _setup(tmp_path, ms)
    assert promote.main(_args(paths, pdir)) == 0
    assert profiles.load_registry(pdir)["zen5"].shapes == {QWEN3: {"rows": 1}}
    # an earlier promote, from artifacts that measured both
    pdir2, both = _setup(tmp_path / "b", [_manifest(h, {QWEN3: {"rows": 1}, MIXTRAL: {"rows": 2}},
                                                    {QWEN3: ["decode"], MIXTRAL: ["decode"]})
                                          for h in ("zen5-cccc", "zen5-dddd")])
    assert promote.main(_args(both, pdir2)) == 0
    capsys.readouterr()
    assert promote.main(_args(paths, pdir2)) == 0
    assert "keep decode: these artifacts did not measure it" in capsys.readouterr().out
    text = (pdir2 / "zen5.yaml").read_text()
    assert profiles.load_registry(pdir2)["zen5"].shapes == {QWEN3: {"rows": 1}, MIXTRAL: {"rows": 2}}
    assert "#   decode promoted: rows=2" + promote.UNMEASURED in text


def test_a_disagreement_keeps_what_the_profile_has(tmp_path):
    ms = [_manifest("zen5-aaaa", {QWEN3: {"rows": 1}}, {QWEN3: ["decode"]}),
          _manifest("zen5-bbbb", {QWEN3: {"rows": 1}}, {QWEN3: ["decode"]})]
    pdir, paths = _setup(tmp_path, ms)
    assert promote.main(_args(paths, pdir)) == 0
    ms2 = [_manifest("zen5-cccc", {QWEN3: {"rows": 2}}, {QWEN3: ["decode"]}),
           _manifest("zen5-dddd", {QWEN3: {"rows": 1}}, {QWEN3: ["decode"]})]
    _, paths2 = _setup(tmp_path / "b", ms2)
    assert promote.main(_args(paths2, pdir)) == 0
    assert profiles.load_registry(pdir)["zen5"].shapes == {QWEN3: {"rows": 1}}


def test_a_dry_run_writes_nothing_and_other_profiles_are_skipped(tmp_path, capsys):
    ms = [_manifest(h, {QWEN3: {"rows": 1}}, {QWEN3: ["decode"]}) for h in ("a", "b")]
    ms.append(dict(_manifest("c", {}, {}), profile="zen4"))
    pdir, paths = _setup(tmp_path, ms)
    before = (pdir / "zen5.yaml").read_text()
    args = _args(paths, pdir)
    args.profile, args.dry_run = "zen5", True
    assert promote.main(args) == 0
    out = capsys.readouterr().out
    assert "skipped m2.json: another profile" in out and "promote decode: rows=1" in out
    assert (pdir / "zen5.yaml").read_text() == before and not (pdir / "evidence").exists()
    args = _args(paths, pdir)
    assert promote.main(args) == 2  # two profiles and none named
