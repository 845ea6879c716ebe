"""llama.cpp beside `colibri_bench e2e`: the e2e bench's random-init transformers model,
written as a GGUF file with the `gguf` package, run through `llama-cpp-python` (the peer as
a package: nothing of llama.cpp is vendored or patched).

The file carries the model's own tensors (bf16, or quantized by the gguf package to q8_0
or q4_0; norms and the router stay f32, as llama.cpp's converter keeps them) and a vocabulary
of type "none": the bench feeds token ids and takes the argmax of the logits itself, so no
tokenizer is needed. Before it is timed, the peer's logits for the prompt are compared with
the transformers model's (`logits_rel_err`): a file llama.cpp reads differently from what
transformers computes would show there.

Install the peer with `pip install gguf llama-cpp-python` (it compiles llama.cpp's CPU
backend; CMAKE_ARGS="-DGGML_NATIVE=ON" builds it for this CPU)."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

# llama.cpp's name of each transformers config class the e2e bench builds
ARCH = {"Qwen3MoeConfig": "qwen3moe", "OlmoeConfig": "olmoe"}
# the GGUF weight type beside each Colibri weight dtype (the same bits per weight, or near)
PEER_TYPE = {"f32": "F32", "bf16": "BF16", "int8": "Q8_0", "int4": "Q4_0", "int4g32": "Q4_0"}


class PeerUnavailable(RuntimeError):
    """The peer cannot run here (a package missing, a model it does not know); says why."""


def _modules():
    try:
        import gguf
        import llama_cpp
    except ImportError as e:
        raise PeerUnavailable(f"llama.cpp beside the bench needs the gguf and llama-cpp-python packages "
                              f"(pip install gguf llama-cpp-python): {e}") from None
    return gguf, llama_cpp


def _rope_theta(cfg) -> float:
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


def write_gguf(model, path: str | Path, qtype: str, say=lambda s: None) -> Path:
    """The transformers model (a Qwen3-MoE or OLMoE one, as e2e builds) as a GGUF file of
    weight type qtype ("F32", "BF16", "Q8_0" or "Q4_0"); its path."""
    gguf, _ = _modules()
    import torch

    from colibri import hf

    cfg = model.config
    arch = ARCH.get(type(cfg).__name__)
    if arch is None:
        raise PeerUnavailable(f"no GGUF architecture for {type(cfg).__name__} here (known: {sorted(ARCH)})")
    T = gguf.GGMLQuantizationType
    wtype = getattr(T, qtype)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch, use_temp_file=True)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    if getattr(cfg, "moe_intermediate_size", None):
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(_rope_theta(cfg))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_tokenizer_model("none")  # token ids only: no vocabulary to load
    w.add_vocab_size(cfg.vocab_size)

    def f32(t) -> np.ndarray:
        return t.detach().float().numpy() if isinstance(t, torch.Tensor) else np.asarray(t, np.float32)

    def add(name: str, t, keep_f32: bool = False) -> None:
        a = f32(t)
        if keep_f32 or wtype == T.F32 or a.ndim == 1:
            w.add_tensor(name, np.ascontiguousarray(a, np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, wtype), raw_dtype=wtype)

    add("token_embd.weight", model.model.embed_tokens.weight)
    for i, layer in enumerate(model.model.layers):
        say(f"llama.cpp peer: writing layer {i + 1}/{cfg.num_hidden_layers} as {qtype}")
        at, b = layer.self_attn, f"blk.{i}."
        add(b + "attn_norm.weight", layer.input_layernorm.weight)
        add(b + "ffn_norm.weight", layer.post_attention_layernorm.weight)
        for ours, theirs in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                             ("o_proj", "attn_output")):
            add(b + theirs + ".weight", getattr(at, ours).weight)
        add(b + "attn_q_norm.weight", at.q_norm.weight)
        add(b + "attn_k_norm.weight", at.k_norm.weight)
        bw = hf.block_weights(layer.mlp, f"layer {i} MoE block")
        add(b + "ffn_gate_inp.weight", bw.router, keep_f32=True)  # the router stays f32, as in llama.cpp
        for name, mats in (("ffn_gate_exps", bw.gate), ("ffn_up_exps", bw.up), ("ffn_down_exps", bw.down)):
            add(b + name + ".weight", torch.stack(mats))
    add("output_norm.weight", model.model.norm.weight)
    add("output.weight", model.lm_head.weight)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class LlamaCppModel:
    """A GGUF file loaded by llama-cpp-python, timed as e2e times generate(): prefill to the
    first new token, then greedy decode steps."""

    def __init__(self, path: str | Path, threads: int, n_ctx: int):
        _, llama_cpp = _modules()
        self._lc = llama_cpp
        self.llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def _logits(self) -> np.ndarray:
        p = self._lc.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(p, shape=(self.n_vocab,)).copy()

    def prompt_logits(self, ids) -> np.ndarray:
        """The last prompt token's logits (float32 [vocab])."""
        self.llm.reset()
        self.llm.eval([int(t) for t in ids])
        return self._logits()

    def time_generate(self, ids, new_tokens: int) -> dict:
        """e2e.time_generate's figures: prefill seconds to the first new token, decode tok/s
        over the new_tokens - 1 steps after it (none with new_tokens 1)."""
        ids = [int(t) for t in ids]
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(ids)
        tok = int(self._logits().argmax())
        t1 = time.perf_counter()
        for _ in range(new_tokens - 1):
            self.llm.eval([tok])
            tok = int(self._logits().argmax())
        t2 = time.perf_counter()
        steps = new_tokens - 1
        out = {"prefill_s": t1 - start, "prefill_tok_s": len(ids) / (t1 - start)}
        if steps:
            out.update({"decode_tok_s": steps / (t2 - t1), "decode_ms_per_token": 1e3 * (t2 - t1) / steps})
        return out

    def close(self) -> None:
        self.llm.close()
