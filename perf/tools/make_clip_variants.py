"""Clip variants of the demo's searched ``kv-cov`` artifact, for the passkey question
(does clipping cut what retrieval needs?). Same rotations, other per-layer clip ratios:

* ``kv-cov-k1``: keys unclipped (``k_clip = 1.0``), values at their searched ratios;
* ``kv-cov-v1``: keys at their searched ratios, values unclipped;
* ``kv-cov-floor90``: both searched ratios raised to at least 0.90;
* ``kv-cov-k94v90`` / ``kv-cov-k96v90``: keys raised to at least 0.94 / 0.96, values to
  at least 0.90.

Usage (repository root; needs ``oscar-kv demo``'s artifacts in
results/eval/demo/rotations)::

    PYTHONPATH=. python perf/tools/make_clip_variants.py /tmp/variants
"""

import os
import sys

from oscar_kernels.calibration.pipeline import with_clips
from oscar_kernels.rotation import RotationArtifact


def main(out_dir: str) -> None:
    art = RotationArtifact.load("results/eval/demo/rotations/kv-cov.safetensors")
    n = len(art.layers)
    k = [float(lr.k_clip) for lr in art.layers]
    v = [float(lr.v_clip) for lr in art.layers]
    os.makedirs(out_dir, exist_ok=True)
    variants = {"kv-cov-k1": ([1.0] * n, v), "kv-cov-v1": (k, [1.0] * n),
                "kv-cov-floor90": ([max(x, 0.9) for x in k], [max(x, 0.9) for x in v]),
                "kv-cov-k94v90": ([max(x, 0.94) for x in k], [max(x, 0.9) for x in v]),
                "kv-cov-k96v90": ([max(x, 0.96) for x in k], [max(x, 0.9) for x in v])}
    for name, (kc, vc) in variants.items():
        with_clips(art, kc, vc, "search").save(os.path.join(out_dir, f"{name}.safetensors"))
        print(name, "k", kc, "v", vc)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/variants")
