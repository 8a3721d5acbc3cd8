"""Real model (slow): ``oscar-kv eval`` on the embedded SmolLM2-135M, tiny budget."""

import json

import pytest

pytestmark = pytest.mark.slow


def test_eval_cli_on_smollm2(tmp_path, capsys):
    pytest.importorskip("transformers")
    from oscar_kernels import cli
    from oscar_kernels.calibration.data import default_model_path

    try:
        default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "eval"
    rc = cli.main(["eval", "--ctx", "768", "--contexts", "768", "--windows", "1",
                   "--methods", "bf16", "naive", "hadamard", "kivi", "--clip", "fixed",
                   "--passkey-lengths", "512", "--passkey-depths", "0.5",
                   "--out-dir", str(out), "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| hadamard | fixed |" in printed
    data = json.load(open(out / "results.json"))
    rows = {r["label"]: r for r in data["rows"]}
    bf16 = rows["bf16"]
    assert 2.0 < bf16["ppl@768"] < 200.0 and bf16["kl"] < 1e-6 and bf16["top1"] == 1.0
    assert bf16["passkey"] == 1.0          # SmolLM2 finds a 5-digit key at 512 tokens
    for label in ("naive (fixed clip)", "hadamard (fixed clip)", "kivi"):
        r = rows[label]
        assert r["kl"] > 0 and r["top1"] < 1.0 and r["tail_ppl@768"] > 0
    # 64-dim heads, one fp16 scale+zero per token and head: 2 + 32/64 bits in the INT2 region
    assert rows["hadamard (fixed clip)"]["bits_int2"] == 2.5
    # rotation helps: Hadamard beats the identity rotation on the tail
    assert rows["hadamard (fixed clip)"]["kl"] < rows["naive (fixed clip)"]["kl"]
    assert (out / "results.png").stat().st_size > 10000
