"""Signatures: every part counts, nothing else does, and they are stable across processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.build.signature import (canonical_json, changed_parts, signature, signature_payload,
                             variant_hash, variant_id)

ROOT = Path(__file__).resolve().parents[2]

BASE = dict(
    host_fingerprint="fp-7f3a9c",
    compiler="gcc",
    compiler_version="12.2.0",
    flags=["-O3", "-march=x86-64-v4", "-mtune=generic"],
    template_source=["/* expert_ffn.c.j2 */ int rows = {{ rows }};\n", "knobs:\n  rows: [1, 2, 4]\n"],
    knobs={"isa": "avx512", "rows": 4, "tok_block": 2, "unroll": 1, "prefetch": 512},
    problem={"name": "qwen3-30b-a3b/decode/f32", "hidden": 2048, "inter": 768, "T": 1, "threads": 2},
)

# Pinned: a change of the canonical form silently invalidates every recorded store, so it
# must be deliberate (bump SIGNATURE_VERSION and update this value).
PINNED = "de322b017a3a2a0712b96d0cd6d1ac0b71ca962d9e5bb7dfdcd051bf4d14eb74"

PAYLOAD_NAME = {"host_fingerprint": "host", "template_source": "template"}


def test_same_inputs_give_the_same_hex_digest():
    a = signature(**BASE)
    assert a == signature(**BASE)
    assert len(a) == 64 and int(a, 16) >= 0


@pytest.mark.parametrize("part, value", [
    ("host_fingerprint", "fp-other"),
    ("compiler", "clang"),
    ("compiler_version", "12.3.0"),
    ("flags", ["-O3", "-march=x86-64-v3", "-mtune=generic"]),
    ("flags", ["-O3", "-march=x86-64-v4"]),
    ("template_source", ["/* expert_ffn.c.j2 */ int rows = {{ rows }}; \n", "knobs:\n  rows: [1, 2, 4]\n"]),
    ("template_source", ["/* expert_ffn.c.j2 */ int rows = {{ rows }};\n", "knobs:\n  rows: [1, 2]\n"]),
    ("knobs", {**BASE["knobs"], "prefetch": 1024}),
    ("knobs", {**BASE["knobs"], "isa": "avx2"}),
    ("knobs", {k: v for k, v in BASE["knobs"].items() if k != "unroll"}),
    ("problem", {**BASE["problem"], "T": 64}),
    ("problem", {**BASE["problem"], "threads": 1}),
])
def test_a_change_in_any_part_changes_the_signature(part, value):
    assert signature(**{**BASE, part: value}) != signature(**BASE)
    old = signature_payload(**BASE)
    new = signature_payload(**{**BASE, part: value})
    assert changed_parts(old, new) == [PAYLOAD_NAME.get(part, part)]


def test_mapping_order_does_not_matter_but_flag_order_does():
    shuffled = dict(BASE, knobs=dict(reversed(list(BASE["knobs"].items()))),
                    problem=dict(sorted(BASE["problem"].items(), reverse=True)))
    assert signature(**shuffled) == signature(**BASE)
    assert signature(**dict(BASE, flags=list(reversed(BASE["flags"])))) != signature(**BASE)


def test_template_source_as_one_string_or_parts():
    one = "template text\nknobs yaml\n"
    assert signature(**dict(BASE, template_source=one)) == signature(**dict(BASE, template_source=[one]))
    # the split between parts is part of the identity: no concatenation ambiguity
    assert (signature(**dict(BASE, template_source=["ab", "c"]))
            != signature(**dict(BASE, template_source=["a", "bc"])))


def test_types_are_distinguished():
    assert signature(**dict(BASE, knobs={"rows": 4})) != signature(**dict(BASE, knobs={"rows": "4"}))
    assert signature(**dict(BASE, knobs={"rows": 4})) != signature(**dict(BASE, knobs={"rows": 4.5}))
    # tuples and lists are the same JSON
    assert (signature(**dict(BASE, flags=tuple(BASE["flags"]))) == signature(**BASE))


def test_rejects_what_has_no_canonical_form():
    with pytest.raises(TypeError):
        signature(**dict(BASE, knobs={"rows": object()}))
    with pytest.raises(TypeError):
        signature(**dict(BASE, problem={1: "x"}))
    with pytest.raises(ValueError):
        signature(**dict(BASE, problem={"x": float("nan")}))
    with pytest.raises(TypeError):
        signature(**dict(BASE, flags="-O3 -march=native"))


_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from tuner.build.signature import signature, variant_id
base = json.loads(sys.stdin.read())
print(signature(**base)); print(variant_id(base["knobs"]))
"""


def test_identical_across_processes_and_hash_seeds():
    outs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT))],
                              input=json.dumps(BASE), capture_output=True, text=True, env=env,
                              check=True)
        outs.add(proc.stdout)
    assert len(outs) == 1
    sig, vid = outs.pop().split()
    assert sig == signature(**BASE) and vid == variant_id(BASE["knobs"])


def test_golden_value_is_pinned():
    # The canonical payload of BASE, and its digest. If this fails, stored results and
    # emitted config.h files no longer match: bump SIGNATURE_VERSION on purpose.
    payload = signature_payload(**BASE)
    assert canonical_json(payload).startswith('{"compiler":"gcc","compiler_version":"12.2.0",'
                                              '"flags":["-O3","-march=x86-64-v4","-mtune=generic"],')
    assert signature(**BASE) == PINNED


def test_variant_id_is_readable_sorted_and_stable():
    knobs = {"unroll": 1, "isa": "avx512", "rows": 4, "tok_block": 2, "prefetch": 512}
    assert variant_id(knobs) == "isa=avx512,prefetch=512,rows=4,tok_block=2,unroll=1"
    assert variant_id(dict(reversed(list(knobs.items())))) == variant_id(knobs)
    assert variant_id({**knobs, "rows": 2}) != variant_id(knobs)
    assert variant_id({"x": "a b"}) == 'x="a b"'      # non-identifier strings as JSON


def test_variant_hash_is_short_hex_and_follows_variant_id():
    knobs = BASE["knobs"]
    h = variant_hash(knobs)
    assert len(h) == 10 and all(c in "0123456789abcdef" for c in h)
    assert h == variant_hash(dict(reversed(list(knobs.items()))))
    assert h != variant_hash({**knobs, "rows": 2})
