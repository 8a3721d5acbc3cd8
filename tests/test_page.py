"""oscar_kernels.page: FlashInfer's page-helper semantics, checked loop by loop and against
FlashInfer 0.7.2's own code where it runs on a CPU (``get_seq_lens`` is pure torch and is
lifted out of ``flashinfer/page.py`` with ``ast``; ``get_batch_indices_positions`` is a
Triton kernel in ``flashinfer/triton/page.py``, run here by the Triton interpreter).

FlashInfer's sources come from the baseline tarball ``baselines/flashinfer/
flashinfer-0.7.2-trim.tar.xz`` in the ``shared/`` folder beside the repository
(``OSCAR_FLASHINFER_TARBALL`` points elsewhere); without it that test skips with the reason
and the loop-by-loop checks still run.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import tarfile

import pytest
import torch

from helpers import i32, make_page_table
from oscar_kernels import ops, page
from oscar_kernels.integrations import flashinfer as fi

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FI_TARBALL = os.environ.get(
    "OSCAR_FLASHINFER_TARBALL",
    os.path.join(_REPO, "..", "shared", "baselines", "flashinfer",
                 "flashinfer-0.7.2-trim.tar.xz"))


def test_one_definition_re_exported():
    """ops and the FlashInfer-shaped API serve the same helpers as oscar_kernels.page."""
    assert ops.get_batch_indices_positions is page.get_batch_indices_positions
    assert fi.get_batch_indices_positions is page.get_batch_indices_positions
    assert fi.get_seq_lens is page.get_seq_lens


@pytest.fixture(scope="module")
def flashinfer_src(tmp_path_factory):
    """FlashInfer 0.7.2's page.py and triton/page.py unpacked from the baseline tarball."""
    if not os.path.isfile(FI_TARBALL):
        pytest.skip(f"FlashInfer baseline tarball not present ({FI_TARBALL}); the "
                    "hand-written FlashInfer-semantics checks below still run")
    root = tmp_path_factory.mktemp("fi")
    with tarfile.open(FI_TARBALL, "r:xz") as tar:
        for name in ("flashinfer/page.py", "flashinfer/triton/page.py"):
            tar.extract(name, root, filter="data")
    return root / "flashinfer"


def _fi_get_seq_lens(src):
    """FlashInfer's ``get_seq_lens`` (pure torch) lifted out of page.py with ``ast``: the
    module itself imports its CUDA JIT machinery, this one function does not."""
    tree = ast.parse((src / "page.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_seq_lens")
    fn.decorator_list = []
    ns = {"torch": torch}
    exec(compile(ast.Module([fn], type_ignores=[]), "flashinfer/page.py", "exec"), ns)
    return ns["get_seq_lens"]


def _fi_triton_batch_indices_positions(src, append_indptr, seq_lens, nnz):
    """FlashInfer's Triton kernel run by the Triton interpreter on the CPU, launched as
    flashinfer.get_batch_indices_positions launches it."""
    pytest.importorskip("triton")
    os.environ["TRITON_INTERPRET"] = "1"
    spec = importlib.util.spec_from_file_location("_fi_triton_page", src / "triton" / "page.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    b = torch.full((nnz,), -1, dtype=torch.int32)
    p = torch.zeros((nnz,), dtype=torch.int32)
    mod.get_batch_indices_positions_kernel[(append_indptr.shape[0] - 1,)](
        append_indptr, seq_lens, b, p, num_stages=2)
    return b, p


def _random_ragged(gen, batch_size, page_size):
    seq_lens = torch.randint(1, 300, (batch_size,), generator=gen)
    appended = torch.minimum(torch.randint(0, 200, (batch_size,), generator=gen), seq_lens)
    append_indptr = i32([0] + torch.cumsum(appended, 0).tolist())
    kv_indptr, kv_indices, kv_last, _ = make_page_table(seq_lens.tolist(), page_size, gen)
    return append_indptr, seq_lens, kv_indptr, kv_last


def _hand_batch_indices_positions(append_indptr, seq_lens, nnz):
    """FlashInfer's documented semantics, written out loop by loop."""
    b = [-1] * nnz
    p = [0] * nnz
    for i in range(append_indptr.shape[0] - 1):
        lo, hi = int(append_indptr[i]), int(append_indptr[i + 1])
        for j in range(lo, hi):
            b[j] = i
            p[j] = int(seq_lens[i]) - (hi - lo) + (j - lo)
    return i32(b), i32(p)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_page_helpers_match_flashinfer_semantics(page_size, gen):
    for batch_size in (1, 5, 17):
        ap, seq_lens, kv_indptr, kv_last = _random_ragged(gen, batch_size, page_size)
        want = (torch.clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0) * page_size + kv_last)
        got = page.get_seq_lens(kv_indptr, kv_last, page_size)
        assert torch.equal(got, want) and torch.equal(got.long(), seq_lens)
        nnz = int(ap[-1])
        for extra in (0, 3):  # FlashInfer marks rows past append_indptr[-1] with -1
            b, p = page.get_batch_indices_positions(ap, seq_lens.to(torch.int32), nnz + extra)
            hb, hp = _hand_batch_indices_positions(ap, seq_lens, nnz + extra)
            assert b.dtype == p.dtype == torch.int32
            assert torch.equal(b, hb) and torch.equal(p, hp)


def test_page_helpers_match_flashinfer_code(flashinfer_src, gen):
    fi_seq_lens = _fi_get_seq_lens(flashinfer_src)
    for page_size in (1, 16):
        ap, seq_lens, kv_indptr, kv_last = _random_ragged(gen, 9, page_size)
        assert torch.equal(page.get_seq_lens(kv_indptr, kv_last, page_size),
                           fi_seq_lens(kv_indptr, kv_last, page_size))
        sl = seq_lens.to(torch.int32)
        nnz = int(ap[-1]) + 5
        want_b, want_p = _fi_triton_batch_indices_positions(flashinfer_src, ap, sl, nnz)
        out_b, out_p = torch.empty(nnz, dtype=torch.int32), torch.empty(nnz, dtype=torch.int32)
        b, p = page.get_batch_indices_positions(ap, sl, nnz, out_b, out_p)
        assert b is out_b and p is out_p
        assert torch.equal(b, want_b) and torch.equal(p, want_p)


def test_batch_indices_positions_are_absolute_positions():
    """Position of appended token i of sequence b is seq_lens[b] - appended[b] + i; a
    sequence with nothing appended gets no rows."""
    b, p = page.get_batch_indices_positions(i32([0, 3, 3, 5]), i32([10, 4, 2]), 5)
    assert b.tolist() == [0, 0, 0, 2, 2]
    assert p.tolist() == [7, 8, 9, 0, 1]
    assert b.dtype == torch.int32 and p.dtype == torch.int32


def test_page_helper_errors():
    with pytest.raises(TypeError, match="append_indptr"):
        page.get_batch_indices_positions([0, 1], i32([1]), 1)
    with pytest.raises(ValueError, match="seq_lens"):
        page.get_batch_indices_positions(i32([0, 1]), i32([1, 2]), 1)
    with pytest.raises(ValueError, match="nnz"):
        page.get_batch_indices_positions(i32([0, 1]), i32([1]), -1)
    with pytest.raises(TypeError, match="positions"):
        page.get_batch_indices_positions(i32([0, 1]), i32([1]), 1,
                                         positions=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="page_size"):
        page.get_seq_lens(i32([0, 1]), i32([1]), 0)
