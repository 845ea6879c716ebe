"""colibri.hf.patch and python -m colibri generate on random-init transformers models of the
four families (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral, OLMoE): f32 logits and
greedy tokens as the unpatched model's; bf16/int8/int4/int4g32 within stated bounds; replaced
blocks and layers freed; a checkpoint folder written here generates from the command line."""
import gc
import json
import subprocess
import sys
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import colibri.hf as hf  # noqa: E402

COMMON = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                                         num_experts_per_tok=2, norm_topk_prob=True, head_dim=16)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                                         num_experts_per_tok=3, norm_topk_prob=False,
                                         shared_expert_intermediate_size=48)),
    "mixtral": ("MixtralConfig", dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", dict(intermediate_size=40, num_experts=8, num_experts_per_tok=2,
                                  norm_topk_prob=False)),
}
# relative L2 error of the logits against the unpatched float32 model, by weight dtype:
# f32 is the issue's 1e-4; the others are the weights' own rounding (bf16 2^-9 per weight,
# int8 per-row scales, int4g32 groups of 32, int4 super-blocks). Measured on these models
# (4 families x 2 seeds): bf16 2.0-2.6e-4, int8 1.0-1.3e-3, int4g32 1.2-1.6e-2 (int4 1.0e-2
# on qwen2_moe seed 3, int4g32 1.4e-2 there); the bounds are ~3-4x that
LOGIT_RTOL = {"f32": 1e-4, "bf16": 1e-3, "int8": 5e-3, "int4": 5e-2, "int4g32": 5e-2}


def make_model(family, seed=0):
    cls_name, extra = FAMILIES[family]
    config = getattr(transformers, cls_name)(**COMMON, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # routers with a clear margin: near-ties would flip on rounding alone
        for name, mod in model.named_modules():
            if name.endswith("mlp.gate") and hasattr(mod, "weight"):
                mod.weight.normal_(0.0, 1.0)
    return model


def copy_of(model):
    import copy

    return copy.deepcopy(model)


def _ids(seed=1, batch=2, length=11):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, COMMON["vocab_size"], (batch, length), generator=g)


def _rel(a, b):
    return float(torch.linalg.norm((a - b).float()) / torch.linalg.norm(b.float()))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_f32_logits_and_greedy_tokens_match_the_unpatched_model(family):
    model = make_model(family)
    patched = copy_of(model)
    n = hf.patch(patched, weight_dtype="f32", handoff=None)
    assert n == COMMON["num_hidden_layers"]
    assert sum(isinstance(m, hf.colibri_block_class()) for m in patched.modules()) == n
    ids = _ids()
    with torch.no_grad():
        want, got = model(ids).logits, patched(ids).logits
    assert got.dtype == want.dtype and got.shape == want.shape
    assert _rel(got, want) <= 1e-4
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    # batch with padding: a left-padded batch through generate(), greedy
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(patched.generate(ids, **kw), model.generate(ids, **kw))


# the same with linear=True (every projection and lm_head too): measured 2.4-3.2e-3,
# 1.1-1.5e-2 and 0.15-0.18 on these tiny models (int4g32 groups of 32 on rows of 64; int4
# 0.12 where int4g32 gave 0.18)
LINEAR_RTOL = {"bf16": 1e-2, "int8": 5e-2, "int4": 0.4, "int4g32": 0.4}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_linear_true_f32_is_exact_too(family):
    model = make_model(family, seed=2)
    patched = copy_of(model)
    n = hf.patch(patched, weight_dtype="f32", linear=True, handoff=None)
    L = COMMON["num_hidden_layers"]
    assert n == L + 4 * L + 1  # MoE blocks, q/k/v/o per layer, lm_head
    assert not any(type(m) is torch.nn.Linear for m in patched.modules())
    ids = _ids(seed=5)
    with torch.no_grad():
        assert _rel(patched(ids).logits, model(ids).logits) <= 1e-4
        kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(patched.generate(ids, **kw), model.generate(ids, **kw))


@pytest.mark.parametrize("dtype", ["bf16", "int8", "int4", "int4g32"])
def test_linear_true_quantized_stays_within_its_bounds(dtype):
    model = make_model("qwen3_moe", seed=3)
    patched = copy_of(model)
    hf.patch(patched, weight_dtype=dtype, linear=True, handoff=None)
    ids = _ids(seed=4)
    with torch.no_grad():
        err = _rel(patched(ids).logits, model(ids).logits)
    assert 0 < err <= LINEAR_RTOL[dtype], (dtype, err)


@pytest.mark.parametrize("dtype", ["bf16", "int8", "int4", "int4g32"])
def test_quantized_experts_stay_within_their_bounds(dtype):
    model = make_model("qwen2_moe", seed=3)
    patched = copy_of(model)
    hf.patch(patched, weight_dtype=dtype, handoff=None)
    ids = _ids(seed=4)
    with torch.no_grad():
        err = _rel(patched(ids).logits, model(ids).logits)
    assert err <= LOGIT_RTOL[dtype], (dtype, err)
    assert err > 0  # the weights were really rounded


def test_a_bf16_model_gets_bf16_in_and_out():
    model = make_model("qwen3_moe", seed=5).to(torch.bfloat16)
    ref = copy_of(model)
    hf.patch(model, weight_dtype="bf16", handoff=None)
    block = model.model.layers[0].mlp
    x = torch.randn(2, 5, COMMON["hidden_size"]).to(torch.bfloat16)
    with torch.no_grad():  # the same bf16 weights computed in float32: only y's rounding apart
        y, want = block(x), ref.model.layers[0].mlp.float()(x.float())
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert _rel(y, want) <= 2**-8
    with torch.no_grad():
        assert model(_ids()).logits.dtype == torch.bfloat16


def test_a_bf16_model_with_near_tied_routers_patches():
    """transformers' own init (router std 0.02): with 128 experts the probabilities nearly tie,
    and bf16 logits pick other experts than float32 ones on random tokens (this seed's
    first block then differed by 0.136 on random tokens); the patch-time check uses tokens
    with a clear routing margin, so it passes and still compares."""
    config = transformers.Qwen3MoeConfig(**dict(COMMON, hidden_size=512), intermediate_size=128,
                                         moe_intermediate_size=32, num_experts=128, num_experts_per_tok=8,
                                         norm_topk_prob=True, head_dim=32)
    torch.manual_seed(2)
    model = transformers.AutoModelForCausalLM.from_config(config).eval().to(torch.bfloat16)
    block = model.model.layers[0].mlp
    tokens = hf.routed_tokens(block.gate.weight.detach().float().numpy(), 8, hf.CHECK_TOKENS)
    logits = tokens.astype(np.float64) @ block.gate.weight.detach().double().numpy().T
    top = np.sort(logits, axis=1)[:, ::-1]
    assert (top[:, 7] - top[:, 8] >= np.abs(top[:, 0]) / 16).all()
    assert hf.patch(model, weight_dtype="bf16", handoff=None) == COMMON["num_hidden_layers"]


def test_replaced_blocks_and_layers_are_freed():
    model = make_model("mixtral", seed=6)
    old = [weakref.ref(layer.mlp) for layer in model.model.layers]
    old_experts = [weakref.ref(layer.mlp.experts.gate_up_proj) for layer in model.model.layers]
    hf.patch(model, handoff=None)
    gc.collect()
    assert all(r() is None for r in old), "a replaced block is still referenced"
    assert all(r() is None for r in old_experts), "the original expert tensors are still alive"
    layers = [weakref.ref(m.layer) for m in model.modules() if isinstance(m, hf.colibri_block_class())]
    assert len(layers) == COMMON["num_hidden_layers"]
    del model
    gc.collect()
    assert all(r() is None for r in layers), "a patched model's Colibri layers outlive it"


def test_a_block_outside_the_contract_is_refused_by_name_and_the_model_kept():
    model = make_model("olmoe", seed=7)
    before = {n: type(m) for n, m in model.named_modules()}

    class SigmoidRouter(torch.nn.Module):  # a router of another kind (sigmoid scoring, a bias)
        def __init__(self, gate):
            super().__init__()
            self.weight, self.top_k = gate.weight, gate.top_k
            self.e_score_correction_bias = torch.nn.Parameter(torch.zeros(gate.weight.shape[0]))

    model.model.layers[1].mlp.gate = SigmoidRouter(model.model.layers[1].mlp.gate)
    with pytest.raises(hf.UnsupportedBlock, match=r"model\.layers\.1\.mlp.*e_score_correction_bias"):
        hf.patch(model, handoff=None)
    assert not any(isinstance(m, hf.colibri_block_class()) for m in model.modules())
    assert type(model.model.layers[0].mlp) is before["model.layers.0.mlp"]


def test_a_block_that_computes_something_else_fails_the_check():
    model = make_model("qwen3_moe", seed=8)
    for layer in model.model.layers:  # gelu experts: the same tensors, another function
        layer.mlp.experts.act_fn = torch.nn.GELU()
    with pytest.raises(hf.UnsupportedBlock, match="activation gelu"):
        hf.patch(model, handoff=None)
    for layer in model.model.layers:
        layer.mlp.experts.act_fn = torch.nn.Tanh()  # a name the contract cannot tell
        del layer.mlp.experts.act_fn
        layer.mlp.experts.act_fn = lambda v: torch.tanh(v)
    with pytest.raises(hf.UnsupportedBlock, match="differs from the block"):
        hf.patch(model, handoff=None)
    assert not any(isinstance(m, hf.colibri_block_class()) for m in model.modules())


def test_hf_shaped_shared_expert_gate_is_accepted():
    import colibri

    rng = np.random.default_rng(0)
    E, I, H, S = 4, 8, 16, 12
    w = lambda *s: rng.standard_normal(s, dtype=np.float32) * 0.1
    args = (w(E, H), w(E, I, H), w(E, I, H), w(E, H, I))
    kw = dict(top_k=2, shared_gate=w(S, H), shared_up=w(S, H), shared_down=w(H, S))
    g = w(1, H)
    x = w(5, H)
    with colibri.MoELayer(*args, shared_expert_gate=g, **kw) as a, \
            colibri.MoELayer(*args, shared_expert_gate=g[0], **kw) as b:
        assert np.array_equal(a(x), b(x))
    with pytest.raises(ValueError, match="shared_expert_gate"):
        colibri.MoELayer(*args, shared_expert_gate=w(2, H), **kw)


# ---- python -m colibri generate on a checkpoint folder written here

def _save_checkpoint(path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(COMMON["vocab_size"] - 2)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>",
                                               pad_token="<eos>")
    model = make_model("qwen3_moe", seed=9)
    model.generation_config.eos_token_id = None  # generate every token asked for
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return _save_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-qwen3-moe")


def _generate(*args):
    return subprocess.run([sys.executable, "-m", "colibri", "generate", *args], capture_output=True,
                          text=True, timeout=600)


def test_generate_streams_text_and_reports_speed_and_memory(checkpoint):
    prompt = "w3 w7 w11 w5"
    res = _generate("--model", str(checkpoint), "--prompt", prompt, "--max-new-tokens", "6", "--threads", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip(), "no text streamed"
    assert "2 MoE blocks on Colibri (f32; hand-off: " in res.stderr and "tok/s" in res.stderr
    assert "peak RSS" in res.stderr
    js = _generate("--model", str(checkpoint), "--prompt", prompt, "--max-new-tokens", "6", "--json")
    assert js.returncode == 0, js.stderr[-3000:]
    out = json.loads(js.stdout)
    assert out["patched_blocks"] == 2 and out["new_tokens"] == 6 and out["prompt_tokens"] == 4
    assert out["prefill_tokens_per_s"] > 0 and out["decode_tokens_per_s"] > 0 and out["peak_rss_bytes"] > 0
    assert out["text"].strip() == res.stdout.strip()
    # patch's hand-off, per module: a fixed threshold is each MoE block's
    assert len(out["handoffs"]) == 2
    fixed = json.loads(_generate("--model", str(checkpoint), "--prompt", prompt, "--max-new-tokens", "2",
                                 "--json", "--handoff", "7").stdout)
    assert set(fixed["handoffs"].values()) == {7}
    base = json.loads(_generate("--model", str(checkpoint), "--prompt", prompt, "--max-new-tokens", "6",
                                "--json", "--no-patch").stdout)
    assert base["patched_blocks"] == 0 and base["text"] == out["text"]  # greedy: the same tokens


def test_generate_errors_are_clear(tmp_path, checkpoint):
    res = _generate("--model", str(tmp_path / "absent"), "--prompt", "w1")
    assert res.returncode == 1 and "not a folder" in res.stderr
    (tmp_path / "empty").mkdir()
    res = _generate("--model", str(tmp_path / "empty"), "--prompt", "w1")
    assert res.returncode == 1 and "no config.json" in res.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    res = _generate("--model", str(bad), "--prompt", "w1")
    assert res.returncode == 1 and "architecture" in res.stderr and "Traceback" not in res.stderr
    res = _generate("--model", str(checkpoint), "--prompt", "w1", "--max-new-tokens", "0")
    assert res.returncode == 2
    res = _generate("--model", str(checkpoint), "--prompt", "w1", "--handoff", "never")
    assert res.returncode == 2 and "auto, off or a token count" in res.stderr


def test_the_patched_modules_refuse_a_wrong_width_and_match_the_checked_call():
    # the modules call the engine by address (MoELayer/Linear._forward_ptrs): their own
    # checks must stand in for __call__'s, and their output must be __call__'s
    model = make_model("qwen3_moe", seed=5)
    hf.patch(model, weight_dtype="f32", linear=True, handoff=None)
    blocks = [m for m in model.modules() if isinstance(m, hf.colibri_block_class())]
    lins = [m for m in model.modules() if isinstance(m, hf.colibri_linear_class())]
    assert blocks and lins
    blk, lin = blocks[0], lins[0]
    x = torch.randn(2, 3, blk.layer.hidden)
    with torch.no_grad():
        assert torch.equal(blk(x), torch.from_numpy(blk.layer(x.reshape(-1, x.shape[-1]).numpy())).view(x.shape))
        # bf16 rows go in as they are (colibri_layer_forward_bf16): the f32 output, rounded
        xb = x.to(torch.bfloat16)
        assert torch.equal(blk(xb), blk(xb.float()).to(torch.bfloat16))
        assert blk(xb[:, :0]).shape == (2, 0, blk.layer.hidden)
        assert torch.equal(blk(xb.transpose(0, 1)), blk(xb.float().transpose(0, 1)).to(torch.bfloat16))
        xl = torch.randn(5, lin.lin.cols)
        want = torch.from_numpy(lin.lin(xl.numpy()))
        if lin.bias is not None:
            want += lin.bias
        assert torch.equal(lin(xl), want)
        xlb = xl.to(torch.bfloat16)
        assert torch.equal(lin(xlb), lin(xlb.float()).to(torch.bfloat16))
        with pytest.raises(ValueError, match=f"takes \\[..., {blk.layer.hidden}\\]"):
            blk(torch.randn(2, blk.layer.hidden + 1))
        with pytest.raises(ValueError, match=f"takes \\[..., {lin.lin.cols}\\]"):
            lin(torch.randn(2, lin.lin.cols - 1))
        with pytest.raises(ValueError, match="tokens is outside"):
            blk.layer._forward_ptrs(x.data_ptr(), x.data_ptr(), -1)


# ---- the hand-off to the original module (never slower than unpatched)

def test_a_fixed_handoff_sends_calls_from_that_many_tokens_to_the_original():
    model = make_model("qwen3_moe", seed=10)
    ref = copy_of(model)
    old_block = weakref.ref(model.model.layers[0].mlp)
    hf.patch(model, weight_dtype="int8", linear=True, handoff={"moe": 4, "linear": 6})
    gc.collect()
    assert old_block() is not None, "a module that hands off keeps its original"
    kept = hf.handoffs(model)
    assert sorted(set(kept.values())) == [4, 6] and len(kept) == 2 + 4 * 2 + 1
    assert "calls of >= 4 tokens to the original" in repr(model.model.layers[0].mlp)
    blk, want_blk = model.model.layers[0].mlp, ref.model.layers[0].mlp
    lin, want_lin = model.model.layers[0].self_attn.q_proj, ref.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        for n in (1, 3, 4, 9):  # int8 weights: Colibri's output differs from the original's
            x = torch.randn(1, n, COMMON["hidden_size"])
            assert torch.equal(blk(x), want_blk(x)) == (n >= 4), n
            assert torch.equal(lin(x), want_lin(x)) == (n >= 6), n
        # tokens are counted over every leading dimension
        assert torch.equal(blk(torch.ones(2, 2, COMMON["hidden_size"])), want_blk(torch.ones(2, 2, COMMON["hidden_size"])))


def test_no_handoff_keeps_no_original_and_bad_values_are_refused():
    model = make_model("olmoe", seed=11)
    hf.patch(model, weight_dtype="f32", linear=True, handoff=None)
    assert set(hf.handoffs(model).values()) == {None}
    assert all(m._handoff == () for m in model.modules() if isinstance(m, hf.colibri_block_class()))
    for bad in (0, -3, 2.5, True, "always", {"moe": 0}, {"attention": 4}):
        with pytest.raises(ValueError, match="handoff must be"):
            hf.patch(make_model("olmoe", seed=11), handoff=bad)


class _Sleeper(torch.nn.Module):
    """A stand-in module whose call on n tokens takes fixed + per_token * n seconds."""

    def __init__(self, fixed, per_token):
        super().__init__()
        self.fixed, self.per_token = fixed, per_token

    def forward(self, x):
        import time

        time.sleep(self.fixed + self.per_token * (x.numel() // x.shape[-1]))
        return x


def test_auto_handoff_finds_where_the_original_gets_faster():
    # original: 2 ms + 2 us a token; new: 100 us a token: new wins at 1 and 8 tokens, the
    # original from 32 (2.06 against 3.2 ms) on
    thr, seen = hf.measure_handoff(_Sleeper(2e-3, 2e-6), _Sleeper(0.0, 1e-4), 8, torch.float32,
                                   tokens=(1, 8, 32, 128), rounds=3)
    assert sorted(seen) == [1, 8, 32, 128]
    assert seen[1][0] > seen[1][1] and seen[128][0] < seen[128][1]
    assert thr == 32
    # the original never faster: no hand-off; faster only at the smallest count: none either
    assert hf.measure_handoff(_Sleeper(1e-3, 1e-5), _Sleeper(0.0, 1e-6), 8, torch.float32,
                              tokens=(1, 32), rounds=2)[0] is None
    assert hf.measure_handoff(_Sleeper(0.0, 1e-6), _Sleeper(1e-3, 0.0), 8, torch.float32,
                              tokens=(1, 2000), rounds=2)[0] is None
    # a near tie (the original 4% faster everywhere) keeps no original
    assert hf.HANDOFF_MARGIN > 1.04
    assert hf.measure_handoff(_Sleeper(5e-3, 0.0), _Sleeper(5.2e-3, 0.0), 8, torch.float32,
                              tokens=(1, 8), rounds=3)[0] is None


def test_auto_handoff_on_a_model_records_a_threshold_per_module():
    model = make_model("mixtral", seed=12)
    ref = copy_of(model)
    hf.patch(model, weight_dtype="f32", linear=True)  # handoff="auto"
    kept = hf.handoffs(model)
    assert len(kept) == 2 + 4 * 2 + 1
    assert set(kept.values()) <= {None, *hf.HANDOFF_TOKENS}
    ids = _ids(seed=13)
    with torch.no_grad():  # whichever path each call takes, f32 stays exact
        assert _rel(model(ids).logits, ref(ids).logits) <= 1e-4


def test_auto_handoff_times_only_unquantized_patches(monkeypatch):
    timed = []
    monkeypatch.setattr(hf, "measure_handoff", lambda *a, **k: (timed.append(1), (1, {}))[1])
    model = make_model("qwen3_moe", seed=14)
    hf.patch(model, weight_dtype="int4", linear=True)  # "auto": quantized, so never timed
    assert not timed and set(hf.handoffs(model).values()) == {None}
    model = make_model("qwen3_moe", seed=14)
    hf.patch(model, weight_dtype="bf16", linear=True)
    assert timed and set(hf.handoffs(model).values()) == {1}
    model = make_model("qwen3_moe", seed=14)
    hf.patch(model, weight_dtype="int8", handoff=64)  # a fixed threshold holds in any dtype
    assert set(hf.handoffs(model).values()) == {64}
