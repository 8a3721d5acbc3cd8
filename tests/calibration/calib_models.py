"""Tiny random decoder models and a tiny tokenizer for the calibration tests."""

from __future__ import annotations

import torch


def tiny_config(family: str, *, head_dim: int = 16, num_layers: int = 2):
    """LlamaConfig / Qwen2Config / Qwen3Config / MistralConfig: hidden 64, 4 q / 2 kv heads."""
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig}[family]
    kw = dict(vocab_size=96, hidden_size=64, intermediate_size=128,
              num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
              head_dim=head_dim, max_position_embeddings=512, tie_word_embeddings=False)
    cfg = cls(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def tiny_model(family: str = "llama", *, seed: int = 0, **kw):
    """A random float32 model (weights scaled up so attention is not uniform)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
    model.eval()
    return model


def tiny_tokenizer(vocab_size: int = 96):
    """A character-level fast tokenizer (no files, no network)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 32 + vocab_size - 3)]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({c: i + 3 for i, c in enumerate(chars)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>")
