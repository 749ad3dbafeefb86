"""`memory --estimate` says what it assumed and, when a row does not fit, what would (issue 43:
the README's own line answered "344 GiB" without naming batch 4, fp32 and naive attention, and
gave no hint); a user's model is labelled with the shape its factory built."""

from __future__ import annotations

import json
import re

from lmperf.cli import main


def test_the_readme_line_names_its_assumptions_and_what_fits(tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    assert main(["memory", "--size", "xl", "--context", "2048", "--estimate", "--gpu",
                 "H100-SXM", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    head = " ".join(text.split("\n\n")[0].split())  # the headline, unwrapped
    first = head.split(" fp32 train-step at context 2048 does not fit")[0]
    for said in ("fp32", "batch 4", "sdpa attention (--gpu's default", "no checkpointing",
                 "AdamW", "on H100-SXM (80 GiB)"):
        assert said in first, said
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["spec"]["attention"] for r in records} == {"sdpa"}  # the planner's, not naive
    fits = re.search(r"does not fit \(([\d.]+) GiB\): fits with (.*)$", head)
    assert fits and float(fits.group(1)) > 80
    named = re.findall(r"(--[\w-]+ \d+) \(([\d.]+) GiB\)", fits.group(2))
    assert named and all(float(gib) <= 80 for _, gib in named)  # each one fits
    assert any(r["metrics"].get("what_fits") for r in records)  # `lmperf table` says it too


def test_a_users_model_is_labelled_with_the_shape_it_built(tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    assert main(["memory", "--model", "tests.fixtures.models:fixed_shape", "--context", "16",
                 "--estimate", "--gib", "8", "--out", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    records = [json.loads(line) for line in out.read_text().splitlines()]
    shape = records[0]["model_shape"]
    assert (shape["d_model"], shape["num_layers"], shape["num_heads"], shape["d_ff"]) == (48, 3, 4, 96)
    assert records[0]["params"] == shape["params"] > 0  # counted, not left empty
    assert "d=48 L=3 H=4 ff=96 V=10000" in text and "receives" not in text
