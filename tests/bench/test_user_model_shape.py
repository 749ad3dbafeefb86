"""A user's model is labelled with the shape its factory built, not the one it was handed
(issue 43: the API bench of a d=256, 4-layer Llama was captioned with tiny's d=64, 2 layers)."""

from __future__ import annotations

import lmperf


def test_bench_captions_and_records_the_shape_read_off_the_model():
    report = lmperf.bench(size="tiny", model="tests.fixtures.models:fixed_shape", context=16,
                          batch=2, precision="fp32", warmup=0, steps=2, inline=True)
    record = report.records[0]
    assert record["status"] == "ok", record.get("message")
    assert record["model_shape"]["d_model"] == 48 and record["model_shape"]["num_layers"] == 3
    assert record["model_shape"]["params"] == record["params"]
    text = " ".join(report.render("text").split())
    assert "(d=48 L=3 H=4 ff=96 V=10000)" in text and "d=64 L=2" not in text
