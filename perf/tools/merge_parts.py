"""Merge ``oscar-kv eval`` runs made in parts (different ``--methods``/``--clip``) into one
table, refusing to merge runs that did not measure the same thing.

Usage (from the repository root)::

    PYTHONPATH=. python perf/tools/merge_parts.py OUT_DIR PART_DIR [PART_DIR ...]

Every part must have the same model, held-out windows, contexts, cache geometry and
passkey grid (meta fields compared below); a row measured in several parts must be
identical in all of them (the pipeline is deterministic), else the merge fails. KL and
top-1 are measured against the bf16 logits inside every part; the columns relative to
the ``bf16`` row (Δ tail perplexity, passkey lost/won) are recomputed from the merged
``bf16`` row, so one part may omit it. Rows keep the order of the parts.
Writes ``results.md``, ``results.json`` and ``results.png`` to ``OUT_DIR`` with every
part's command in the header. Hand-written sections of an existing ``OUT_DIR/results.md``
that start at a line ``<!-- kept by merge_parts.py -->`` are carried over to the end of the
new one.
"""

from __future__ import annotations

import json
import os
import sys

from oscar_kernels.evaluation.report import write_outputs

SAME = ("model", "heldout", "heldout_tokens", "windows", "ctx", "contexts", "tail_start",
        "sink_size", "recent_size", "group_size", "passkey_lengths", "passkey_depths",
        "passkey_seed", "passkey_cache", "passkey_keys_per_cell")
# may differ between parts: a part with --passkey-stride runs a subset of the same prompts
# (the table shows each row's own trial count)
VOLATILE = ("seconds", "passkey_seconds")
#: results.md from this line on is hand-written and survives a re-merge
KEEP_MARKER = "<!-- kept by merge_parts.py -->"


def _stable(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in VOLATILE}


def _relative_to_bf16(rows: list[dict], meta: dict) -> None:
    """(Re)compute the columns relative to the ``bf16`` row for every row, so a part
    without its own ``bf16`` row gets them too (KL and top-1 are always measured against
    the bf16 logits of the same windows, in every part)."""
    from oscar_kernels.evaluation.passkey import paired_comparison

    base = next((r for r in rows if r["kind"] == "bf16"), None)
    if base is None:
        raise SystemExit("no part has a bf16 row")
    key = f"tail_ppl@{meta['ctx']}"
    for r in rows:
        if r is base:
            continue
        if key in r and key in base:
            r[f"{key}_vs_bf16_pct"] = 100.0 * (r[key] / base[key] - 1.0)
        if r.get("passkey_trials") and base.get("passkey_trials"):
            # pair by prompt: a part run with --passkey-stride holds a subset of the grid
            ref = {(t["length"], t["depth"], t["key"]): t["correct"]
                   for t in base["passkey_trials"]}
            mine = [t for t in r["passkey_trials"]
                    if (t["length"], t["depth"], t["key"]) in ref]
            if len(mine) != len(r["passkey_trials"]):
                raise SystemExit(f"{r['label']}: passkey prompts the bf16 row did not run")
            r["passkey_vs_bf16"] = paired_comparison(
                [t["correct"] for t in mine],
                [ref[(t["length"], t["depth"], t["key"])] for t in mine])


def merge(parts: list[str]) -> tuple[list[dict], dict, list[str]]:
    metas, rows, notes, seen = [], [], [], {}
    for d in parts:
        data = json.load(open(os.path.join(d, "results.json")))
        meta = data["meta"]
        if metas:
            for k in SAME:
                if meta.get(k) != metas[0].get(k):
                    raise SystemExit(f"{d}: meta[{k!r}] = {meta.get(k)!r} differs from "
                                     f"{parts[0]}: {metas[0].get(k)!r}")
        metas.append(meta)
        for r in data["rows"]:
            if r["label"] in seen:
                if _stable(r) != _stable(seen[r["label"]]):
                    raise SystemExit(f"{d}: row {r['label']!r} differs from an earlier part")
                continue
            seen[r["label"]] = r
            rows.append(r)
        notes += [n for n in data.get("notes", []) if n not in notes]
    _relative_to_bf16(rows, metas[0])
    meta = dict(metas[0])
    strides = sorted({m.get("passkey_trial_stride") or 1 for m in metas})
    meta["passkey_trial_stride"] = strides[0] if len(strides) == 1 else strides
    meta["command"] = " ; ".join(m["command"] for m in metas)
    meta["parts"] = [{"dir": d, "command": m["command"], "date": m["date"],
                      "seconds_total": m["seconds_total"],
                      "loadavg_start": m["environment"].get("loadavg_start")}
                     for d, m in zip(parts, metas)]
    meta["seconds_total"] = round(sum(m["seconds_total"] for m in metas), 1)
    meta["date"] = max(m["date"] for m in metas)
    return rows, meta, notes


def kept_tail(md_path: str) -> str:
    """The hand-written tail of an existing results.md (from :data:`KEEP_MARKER`), or ''."""
    if not os.path.exists(md_path):
        return ""
    text = open(md_path).read()
    i = text.find(KEEP_MARKER)
    return text[i:] if i >= 0 else ""


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    out, parts = argv[0], argv[1:]
    rows, meta, notes = merge(parts)
    # drop notes about rows another part did measure
    labels = {r["label"] for r in rows}
    notes = [n for n in notes if n.split(":")[0] not in labels]
    tail = kept_tail(os.path.join(out, "results.md"))
    paths = write_outputs(out, rows, meta, meta["contexts"], meta["tail_start"], notes)
    if tail:
        with open(paths[0], "a") as f:
            f.write("\n" + tail)
    print("wrote", ", ".join(paths), f"({len(rows)} rows from {len(parts)} parts)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
