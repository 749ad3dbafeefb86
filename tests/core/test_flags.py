"""One flag per idea, and "did you mean" for a mistyped flag or choice (one line, exit 2)."""

from __future__ import annotations

import pytest

from lmperf.cli import main


def _error(capsys, *argv: str) -> str:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_a_mistyped_flag_says_did_you_mean(capsys):
    assert "did you mean --size?" in _error(capsys, "bench", "--szie", "tiny")
    assert "did you mean --precision?" in _error(capsys, "bench", "--precison", "fp32")


def test_a_mistyped_choice_says_did_you_mean(capsys):
    assert "did you mean bf16-mixed or bf16-true?" in _error(capsys, "bench", "--precision", "bf16")
    assert "did you mean tiny?" in _error(capsys, "bench", "--size", "tin")
    assert "did you mean cpu?" in _error(capsys, "bench", "--device", "cpuu")


@pytest.mark.parametrize("argv, says", [
    (["attention", "--dtype", "bf16-mixed"], "and attention runs none"),
    (["dist", "comm", "--dtype", "bf16-mixed"], "which --precision takes"),
    (["dist", "--estimate", "--comm-dtype=fp16-true"], "which --precision takes"),
])
def test_a_regime_given_to_a_dtype_flag_names_the_flag_that_takes_it(capsys, argv, says):
    err = _error(capsys, *argv)
    assert "takes a tensor dtype (fp32, bf16, fp16), not a precision regime" in err and says in err


def test_attention_precision_is_one_line_that_names_dtype(capsys):
    err = _error(capsys, "attention", "--precision", "bf16-mixed")
    assert "--dtype" in err and "no precision regime" in err and "warning" not in err


def test_world_size_is_ranks_here_and_gpus_the_targets(capsys):
    ffn = ["--ffn-only", "--d-model", "64", "--d-ff", "256", "--num-layers", "2"]
    assert "--gpus" in _error(capsys, "dist", "--estimate", *ffn, "--world-size", "8")
    assert main(["dist", "--estimate", *ffn, "--gpus", "8", "64"]) == 0


def test_report_takes_out_and_keeps_o(capsys):
    from lmperf.cli import build_parser

    for flag in ("--out", "-o"):
        args = build_parser("report").parse_args(["report", "x.jsonl", flag, "r.html"])
        assert str(args.output) == "r.html"
    assert "renamed --out" in _error(capsys, "report", "x.jsonl", "--output", "r.html")
