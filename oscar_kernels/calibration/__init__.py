"""Offline calibration: capture post-RoPE Q/K/V from a real model, fit rotations, pick
clip ratios, measure the attention-output error (``oscar-kv calibrate``).

Modules: :mod:`.data` (models and texts), :mod:`.capture` (the AttentionInterface hook),
:mod:`.stats` (streaming float64 statistics), :mod:`.fit` (OSCAR and baseline
rotations), :mod:`.attn_error` (window-rule error, clip search), :mod:`.pipeline`,
:mod:`.report`, :mod:`.arguments` (command-line argument types), :mod:`.calibrate_cmd`.
See docs/calibration.md.
"""
