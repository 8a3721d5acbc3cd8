"""The decode CUDA-graph batch sizes SGLang captures in this process.

A decode batch padded to a captured size repeats SGLang's padding row 0, and each entry
needs its own window slot, so the memory plan reserves spares for the largest captured
batch (:func:`~oscar_kernels.integrations.sglang.memory_plan.int2_graph_max_bs`). These
functions read SGLang's runtime configuration; they import SGLang when called.
"""

from __future__ import annotations

from .memory_plan import int2_graph_max_bs


def decode_graph_capture_bs(device) -> list[int]:
    """SGLang's decode CUDA-graph capture list, or ``[]`` when no decode graph calls
    ``init_cuda_graph_state`` (``capture_decode_graph``: off on CPU, or with the decode
    backend ``disabled``: ``--disable-cuda-graph``, ``--cuda-graph-backend-decode disabled``)."""
    if str(device).startswith("cpu"):
        return []
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec

    dec = get_exec().graph.cuda_graph_config.decode
    if dec.backend == Backend.DISABLED or not dec.bs:
        return []
    return [int(b) for b in dec.bs]


def graph_max_bs_fn(device):
    """``rows -> largest captured decode batch`` for this process (0 without graphs), the
    larger of SGLang's two batch-size alignments (with and without gathered buffers)."""
    capture_bs = decode_graph_capture_bs(device)
    if not capture_bs:
        return lambda rows: 0
    from sglang.srt.utils.common import get_cuda_graph_batch_size_alignment

    aligns = {int(get_cuda_graph_batch_size_alignment(gathered_buffer_required=g))
              for g in (False, True)}
    return lambda rows: max(int2_graph_max_bs(int(rows), capture_bs=capture_bs,
                                              bs_alignment=a) for a in aligns)
