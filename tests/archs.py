"""Tiny random configs of every supported decoder family (shared by the capture and architecture tests).

2 layers (unless asked), hidden 64, 4 heads, 2 KV heads where the family has GQA, a sliding window
shorter than the test sequences where the family has one, MoE blocks with 4 experts.
"""

from __future__ import annotations

import torch

V = 100
WINDOW = 8

ARCHS = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
         "phi", "phi3", "olmo2", "gpt_neox", "starcoder2", "granite", "cohere", "smollm3", "gpt2"]


def tiny_config(arch: str, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv: int = 2, positions: int = 128):
    import transformers as tf

    common = dict(vocab_size=V, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, max_position_embeddings=positions, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    hd = hidden // heads
    alt = ["sliding_attention", "full_attention"] * layers
    if arch == "llama":
        return tf.LlamaConfig(**common, num_key_value_heads=kv)
    if arch == "mistral":
        return tf.MistralConfig(**common, num_key_value_heads=kv, sliding_window=WINDOW)
    if arch == "mixtral":
        return tf.MixtralConfig(**common, num_key_value_heads=kv, sliding_window=WINDOW, num_local_experts=4,
                                num_experts_per_tok=2)
    if arch == "qwen2":  # sliding window on layers >= max_window_layers
        return tf.Qwen2Config(**common, num_key_value_heads=kv, use_sliding_window=True, sliding_window=WINDOW,
                              max_window_layers=1)
    if arch == "qwen2_moe":
        return tf.Qwen2MoeConfig(**common, num_key_value_heads=kv, use_sliding_window=True, sliding_window=WINDOW,
                                 max_window_layers=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=32)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, num_key_value_heads=kv, head_dim=hd)
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**common, num_key_value_heads=kv, head_dim=hd, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=32)
    if arch == "gemma":
        return tf.GemmaConfig(**common, num_key_value_heads=1, head_dim=hd)
    if arch == "gemma2":  # small soft-cap so the tanh is far from linear on these logits
        return tf.Gemma2Config(**common, num_key_value_heads=kv, head_dim=hd, sliding_window=WINDOW,
                               attn_logit_softcapping=3.0, query_pre_attn_scalar=hd, layer_types=alt[:layers])
    if arch == "gemma3_text":  # two rotary tables: local base 1e4, global base 1e6 with linear scaling
        return tf.Gemma3TextConfig(**common, num_key_value_heads=kv, head_dim=hd, sliding_window=WINDOW,
                                   query_pre_attn_scalar=hd, layer_types=alt[:layers],
                                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                    "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                       "rope_theta": 1e6}})
    if arch == "phi":
        return tf.PhiConfig(**common, num_key_value_heads=kv, partial_rotary_factor=0.5)
    if arch == "phi3":
        return tf.Phi3Config(**common, num_key_value_heads=kv, partial_rotary_factor=0.5)
    if arch == "olmo2":
        return tf.Olmo2Config(**common, num_key_value_heads=kv)
    if arch == "gpt_neox":
        return tf.GPTNeoXConfig(vocab_size=V, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                num_attention_heads=heads, max_position_embeddings=positions, rotary_pct=0.25,
                                use_parallel_residual=True, bos_token_id=1, eos_token_id=2)
    if arch == "starcoder2":
        return tf.Starcoder2Config(**common, num_key_value_heads=kv, sliding_window=WINDOW)
    if arch == "granite":
        return tf.GraniteConfig(**common, num_key_value_heads=kv, embedding_multiplier=2.0, residual_multiplier=0.5,
                                attention_multiplier=0.3, logits_scaling=2.0)
    if arch == "cohere":
        return tf.CohereConfig(**common, num_key_value_heads=kv)
    if arch == "smollm3":
        return tf.SmolLM3Config(**common, num_key_value_heads=kv, no_rope_layers=([1, 0] * layers)[:layers])
    if arch == "gpt2":
        return tf.GPT2Config(vocab_size=V, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=positions,
                             bos_token_id=1, eos_token_id=2)
    raise ValueError(arch)


def save_tiny(arch: str, path, seed: int = 0, **kw):
    """A random model of ``arch`` saved with ``save_pretrained``; q/k weights scaled up so attention is far
    from uniform (probs/scores comparisons are not trivially close)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("q_proj", "k_proj", "qkv_proj", "c_attn", "query_key_value")) and p.ndim == 2:
                p.mul_(8.0)
    model.save_pretrained(str(path))
    return path


def compare_pair(scale: float = 3.0):
    """Two tiny llamas for ``poslens.compare`` with a real change: A (2 layers × 4 heads, 48 positions, q and k
    weights ×8 so attention is far from uniform) and B, a copy whose layer-1 query rows of heads 0 and 1
    are scaled by ``scale`` (sharper attention there, nothing else changed). Named ``tiny_a`` and ``tiny_b``."""
    import copy

    import torch
    import transformers as tf

    torch.manual_seed(0)
    a = tf.LlamaForCausalLM(tiny_config("llama", layers=2, positions=48)).eval()
    with torch.no_grad():
        for layer in a.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    b = copy.deepcopy(a)
    hd = a.config.hidden_size // a.config.num_attention_heads
    with torch.no_grad():
        b.model.layers[1].self_attn.q_proj.weight[:2 * hd].mul_(scale)
    a.name_or_path, b.name_or_path = "tiny_a", "tiny_b"
    return a, b
