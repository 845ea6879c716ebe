"""A model under a memory budget (kernels/expert_cache.c, Model.load(memory_budget=)): the
routed experts take turns in a cache, read from the file, and the outputs are the same bits
as the unbudgeted model's; the budget holds; a corrupt expert fails the call that reads it."""
import numpy as np
import pytest
from moe_data import make_case

from colibri import ColibriError
from colibri.model import Model, ModelFormatError
from colibri.modelfile import save_model

H, I, E, K = 64, 48, 8, 2


def _layers(n, S=0, seed=0):
    out = []
    for i in range(n):
        case = make_case(H=H, I=I, E=E, k=K, S=S, gated=bool(S), seed=seed + i)
        out.append(dict(router=case.router, gate=case.gate, up=case.up, down=case.down,
                        **case.layer_kwargs()))
    return out


@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8", "int4", "int4g32"])
@pytest.mark.parametrize("shared", [0, 24])
def test_outputs_are_the_same_bits_at_every_budget(lib, tmp_path, dtype, shared):
    p = tmp_path / "m.colibri"
    save_model(p, _layers(3, S=shared, seed=5), weight_dtype=dtype)
    full = Model.load(p, lib=lib)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((T, H), dtype=np.float32) for T in (1, 1, 3, 17, 64)]
    want = [full(x) for x in xs]
    resident = None
    for slots in (1, 3, 3 * E):  # one expert at a time, a few, all of them
        probe = Model.load(p, lib=lib, memory_budget=1 << 40)
        per = None
        try:
            st = probe.stats()
            resident = st["resident_bytes"]  # the routers and shared experts alone: nothing cached yet
            probe(xs[-1])
            st = probe.stats()
            per = (st["resident_bytes"] - resident) // min(st["misses"], st["cache_slots"])
            staging = st["staging_bytes"]  # the read buffers, paid from the budget
        finally:
            probe.close()
        budget = resident + staging + slots * per
        with Model.load(p, lib=lib, memory_budget=budget) as m:
            assert m.stats()["cache_slots"] == slots
            for x, w in zip(xs, want):
                np.testing.assert_array_equal(m(x), w)
            st = m.stats()
            assert st["budget_bytes"] == budget and st["resident_bytes"] + st["staging_bytes"] <= budget
            assert st["misses"] > 0 and st["bytes_read"] > 0
            if slots == 1:
                assert st["evictions"] > 0  # 2 experts a token, one slot: every turn reads
            if slots == 3 * E:
                assert st["evictions"] == 0
                assert st["misses"] <= 3 * E and st["hits"] > 0


def test_an_unbudgeted_model_reports_its_weights_and_no_cache(lib, tmp_path):
    p = tmp_path / "m.colibri"
    save_model(p, _layers(2), weight_dtype="int8")
    with Model.load(p, lib=lib) as m:
        m(np.ones((2, H), np.float32))
        st = m.stats()
    assert st["budget_bytes"] == 0 and st["cache_slots"] == 0
    assert st["hits"] == st["misses"] == st["bytes_read"] == 0
    assert st["resident_bytes"] >= 2 * 3 * E * I * H  # every expert's int8 weights


def test_a_budget_too_small_is_refused_with_what_it_needs(lib, tmp_path):
    p = tmp_path / "m.colibri"
    save_model(p, _layers(2, S=24), weight_dtype="f32")
    with pytest.raises(ColibriError, match="memory_budget .* routers and shared experts"):
        Model.load(p, lib=lib, memory_budget=1000)
    with Model.load(p, lib=lib, memory_budget=1 << 40) as m:
        resident = m.stats()["resident_bytes"]
    with pytest.raises(ColibriError, match="one expert needs"):
        Model.load(p, lib=lib, memory_budget=resident + 100)
    for bad, err in ((0, ValueError), (-5, ValueError), (True, TypeError), (1.5e6, TypeError)):
        with pytest.raises(err, match="memory_budget"):
            Model.load(p, lib=lib, memory_budget=bad)


def _corrupt_expert_payload(path, layer, expert):
    """Flips a byte inside the gate of `expert` in `layer` (FORMAT.md: the slot table names
    each slot's tensor; the tensor table its payload offset)."""
    import struct

    raw = bytearray(path.read_bytes())
    n_layers, n_experts = struct.unpack_from("<I", raw, 12)[0], struct.unpack_from("<I", raw, 24)[0]
    slot_off, tensor_off = struct.unpack_from("<QQ", raw, 72)
    slots_per_layer = 1 + 3 * n_experts + 4
    assert layer < n_layers
    t = struct.unpack_from("<I", raw, slot_off + 4 * (layer * slots_per_layer + 1 + 3 * expert))[0]
    entry = tensor_off + 48 * t
    offset = struct.unpack_from("<Q", raw, entry + 24)[0]
    raw[offset + 5] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("io_threads", [0, -1])  # reads on I/O threads, or on the call's
def test_a_corrupt_expert_fails_the_call_that_reads_it_and_nothing_else(lib, tmp_path, io_threads):
    p = tmp_path / "m.colibri"
    save_model(p, _layers(2), weight_dtype="int8", share=False)
    x = np.random.default_rng(3).standard_normal((64, H), dtype=np.float32)  # meets every expert
    want = Model.load(p, lib=lib)(x)
    _corrupt_expert_payload(p, layer=1, expert=3)
    with pytest.raises(ModelFormatError, match="crc32"):
        Model.load(p, lib=lib)  # unbudgeted: every CRC at load, as before
    with Model.load(p, lib=lib, memory_budget=1 << 40, io_threads=io_threads) as m:  # checked when read
        for _ in range(2):  # the same clear error every time; the process goes on
            with pytest.raises(ModelFormatError, match=r"layer 1, expert 3 .*corrupt"):
                m(x)
    with Model.load(p, lib=lib, memory_budget=1 << 40, check_crc=False) as m:
        assert not np.array_equal(m(x), want)  # unchecked: the flipped byte computes


@pytest.mark.parametrize("io_threads,read_depth,direct_io,policy", [(-1, 0, 0, None), (-1, 1, -1, "lfu"),
                                                                     (1, 1, 1, "lru"), (0, 0, -1, None),
                                                                     (3, 2, 0, "lfu")])
def test_reads_on_io_threads_or_the_calls_threads_give_the_same_bits(lib, tmp_path, io_threads, read_depth,
                                                                      direct_io, policy):
    p = tmp_path / "m.colibri"
    save_model(p, _layers(3, S=24, seed=9), weight_dtype="int4")
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((T, H), dtype=np.float32) for T in (1, 5, 64, 1)]
    with Model.load(p, lib=lib) as full:
        want = [full(x) for x in xs]
    with Model.load(p, lib=lib, memory_budget=1 << 40, read_depth=1) as probe:
        resident, stage = probe.stats()["resident_bytes"], probe.stats()["staging_bytes"]
        probe(xs[0][:1])
        per = probe.stats()["resident_bytes"] - resident  # one token's first layer: K experts
        per //= probe.stats()["misses"]
    depth = read_depth or 8
    budget = resident + depth * stage + 4 * per  # four slots: most of a 64-token call misses
    with Model.load(p, lib=lib, memory_budget=budget, io_threads=io_threads, read_depth=read_depth,
                    direct_io=direct_io, policy=policy) as m:
        for x, w in zip(xs, want):
            np.testing.assert_array_equal(m(x), w)
        st = m.stats()
    # O_DIRECT where asked (the default) and the file system takes it (tmpfs does not)
    assert st["direct_io"] in ((0,) if direct_io < 0 else (0, 1))
    assert st["cache_slots"] == 4 and st["staging_bytes"] == depth * stage
    assert st["io_threads"] == (0 if io_threads < 0 else io_threads or 4)
    assert st["policy"] == (policy or "lru")
    assert st["misses"] > 4 and st["evictions"] > 0
    assert 0 <= st["wait_seconds"] <= st["stall_seconds"]
    if io_threads < 0:
        assert st["wait_seconds"] == 0  # nothing to wait for: the call's threads read


def test_read_options_out_of_range_are_refused(lib, tmp_path):
    from colibri._lib import ffi, last_error

    p = tmp_path / "m.colibri"
    save_model(p, _layers(1), weight_dtype="int8")
    for kw, err in (({"io_threads": -2}, ValueError), ({"io_threads": 1.0}, TypeError),
                    ({"read_depth": -1}, ValueError), ({"read_depth": 5000}, ValueError),
                    ({"direct_io": 2}, ValueError), ({"policy": "mru"}, ValueError), ({"policy": 2}, ValueError)):
        with pytest.raises(err, match=next(iter(kw))):
            Model.load(p, lib=lib, memory_budget=1 << 30, **kw)
    opts = ffi.new("colibri_load_options *", {"memory_budget": 1 << 30, "io_threads": -2})
    assert lib.colibri_load_model_with(str(p).encode(), opts) == ffi.NULL
    assert "io_threads" in last_error(lib)
    opts = ffi.new("colibri_load_options *", {"memory_budget": 1 << 30, "policy": 3})
    assert lib.colibri_load_model_with(str(p).encode(), opts) == ffi.NULL
    assert "policy" in last_error(lib)


def _pointed(lib, tmp_path, slots, policy):
    """A one-layer model whose router picks the two experts a token points at (token(a, b)),
    loaded with `slots` cache slots under `policy`."""
    rng = np.random.default_rng(2)
    w = lambda *s: rng.standard_normal(s, dtype=np.float32) * np.float32(0.1)  # noqa: E731
    layer = dict(router=np.eye(E, H, dtype=np.float32), gate=w(E, I, H), up=w(E, I, H), down=w(E, H, I), top_k=2)
    p = tmp_path / "m.colibri"
    save_model(p, [layer], weight_dtype="int8")
    with Model.load(p, lib=lib, memory_budget=1 << 40, read_depth=1) as probe:
        resident, stage = probe.stats()["resident_bytes"], probe.stats()["staging_bytes"]
        probe(_token(0, 1))
        per = (probe.stats()["resident_bytes"] - resident) // 2
    m = Model.load(p, lib=lib, memory_budget=resident + stage + slots * per, read_depth=1, policy=policy)
    assert m.stats()["cache_slots"] == slots
    return m


def _token(a, b):
    x = np.zeros((1, H), np.float32)
    x[0, a] = x[0, b] = 10.0
    return x


@pytest.mark.parametrize("policy,misses", [("lru", 5), ("lfu", 4)])
def test_the_policy_picks_which_expert_a_miss_evicts(lib, tmp_path, policy, misses):
    A, B, C, D = 0, 1, 2, 3
    with _pointed(lib, tmp_path, 3, policy) as m:
        for a, b in [(A, B)] * 3 + [(C, A), (D, A)]:
            m(_token(a, b))
        # B: used 3 times, last at turn 3; C: once, at turn 4. D's miss evicts B under LRU
        # and C under LFU, so B misses once more under LRU only
        m(_token(B, A))
        assert m.stats()["misses"] == misses


def test_lfu_counts_fade_so_old_favourites_give_way(lib, tmp_path):
    # 4 slots; experts 0 and 1 hot for 1000 calls, then the pairs (2, 3) and (4, 5) take
    # turns, each pair every other call. Without fading, the new experts' counts would pass
    # the old favourites' 1000 only after 2000 calls, every one missing twice until then; the
    # counts halve every 1024 calls (COLIBRI_LFU_HALF_LIFE), so by call 1300 they have, and
    # the four new experts stay
    with _pointed(lib, tmp_path, 4, "lfu") as m:
        for _ in range(1000):
            m(_token(0, 1))
        pairs = [_token(2, 3), _token(4, 5)]
        for i in range(1300):
            m(pairs[i % 2])
        before = m.stats()["misses"]
        for i in range(200):
            m(pairs[i % 2])
        assert m.stats()["misses"] == before


def test_a_truncated_file_is_refused_at_load_with_a_budget_too(lib, tmp_path):
    p = tmp_path / "m.colibri"
    save_model(p, _layers(1), weight_dtype="int8")
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(ModelFormatError):
        Model.load(p, lib=lib, memory_budget=1 << 30)


def test_stats_of_nothing_are_an_error_not_a_crash(lib):
    from colibri._lib import ffi, last_error

    st = ffi.new("colibri_memory_stats *")
    assert lib.colibri_model_stats(ffi.NULL, st) != 0 and "NULL" in last_error(lib)
