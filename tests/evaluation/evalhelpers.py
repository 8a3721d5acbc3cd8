"""Shared builders for the evaluation tests: a tiny random Llama and a char tokenizer."""

import string

import torch

VOCAB = string.printable[:93] + " \n"   # 95 symbols (no "~"); id 95 is BOS


class CharTokenizer:
    """Character-level stand-in with the slice of the tokenizer API the eval uses."""

    bos_token_id = 95

    def __call__(self, text, add_special_tokens=False, return_attention_mask=False, verbose=False):
        return {"input_ids": [VOCAB.index(c) if c in VOCAB else 0 for c in text]}

    def decode(self, ids):
        return "".join(VOCAB[i] if i < len(VOCAB) else "" for i in ids)


def tiny_llama(seed=0, head_dim=16, num_layers=2, max_positions=512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=num_layers, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=head_dim,
                      max_position_embeddings=max_positions, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight.mul_(4.0)
            layer.self_attn.v_proj.weight.mul_(4.0)
    return model


def save_checkpoint(directory, seed=0, **kw):
    """Write ``tiny_llama`` and a character-level fast tokenizer over ``VOCAB`` to
    ``directory`` (loadable with ``oscar_kernels.calibration.data.load_model``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(VOCAB)} | {"<s>": CharTokenizer.bos_token_id}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=VOCAB[0]))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>").save_pretrained(directory)
    tiny_llama(seed=seed, **kw).save_pretrained(directory)
    return directory
