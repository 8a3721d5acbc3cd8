"""What INT2 does to a real model: perplexity, tail perplexity, KL, top-1 agreement,
passkey retrieval and bits per element, per KV-cache method (``oscar-kv eval``), and the
``oscar-kv demo`` that calibrates and evaluates the embedded SmolLM2-135M.

Modules: :mod:`.methods` (the rows: bf16, INT2 with a rotation and a clip policy, KIVI-2),
:mod:`.kivi` (the KIVI-2 emulation), :mod:`.passkey` (prompts, greedy decoding,
intervals), :mod:`.metrics` (scoring), :mod:`.report` (table, JSON, PNG),
:mod:`.eval_cmd`, :mod:`.demo_cmd`. Evaluation imports calibration (models, texts),
never the reverse. See docs/evaluation.md.
"""
