"""A Hugging Face `transformers` Llama as an lmperf model: `--model examples.hf_llama:llama`.

    lmperf bench --model examples.hf_llama:llama --size mini --context 128 --batch 2

(from the repository root: `--model` imports modules from the current directory). The factory
maps lmperf's `ModelConfig` onto a `LlamaConfig` and returns `LlamaForCausalLM` with random
weights (nothing is downloaded). lmperf takes what transformers' causal LMs return (an output
object with `.logits`) as logits (B, T, vocab). `num_kv_heads` (grouped-query attention) and
`tie_embeddings` are read when the config has them. lmperf's attention names map to
transformers' implementations: "naive" -> "eager", anything else -> "sdpa" (runs everywhere,
meta and fake tensors included). Needs `pip install "transformers>=5.4"` (earlier versions
enter `torch.autocast` on the meta device in RoPE, which torch refuses: lmperf's meta-device
output check fails in one line). Documented in docs/commands/bench.md ("Your own model").
"""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM


def llama_config(config) -> LlamaConfig:
    """lmperf's ModelConfig -> transformers' LlamaConfig (no KV cache: training steps)."""
    return LlamaConfig(
        vocab_size=config.vocab_size,
        max_position_embeddings=config.context_length,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=getattr(config, "num_kv_heads", None) or config.num_heads,
        rope_theta=config.rope_theta,
        tie_word_embeddings=bool(getattr(config, "tie_embeddings", False)),
        attn_implementation="eager" if config.attention == "naive" else "sdpa",
        use_cache=False,
    )


def llama(config) -> LlamaForCausalLM:
    """The factory: a randomly initialised Llama of `config`'s shape."""
    return LlamaForCausalLM(llama_config(config))
