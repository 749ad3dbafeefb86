"""An A/B sweep: several --model values are a sweep axis (the outermost, so that with --rounds
the sides alternate run by run); 'reference' names the reference LM."""

from __future__ import annotations

import pytest

from lmperf.errors import SpecError
from lmperf.questions.bench.plan import models_of, plan_bench

TWICE = "tests.fixtures.models:twice"


def test_models_of_names_the_reference_and_drops_duplicates():
    assert models_of(None) == [None] and models_of("none") == [None]
    assert models_of(["reference", TWICE, TWICE, "None"]) == [None, TWICE]


def test_two_models_are_the_outermost_axis_of_the_plan():
    plan = plan_bench(model=["reference", TWICE], size="tiny", context=[16, 32], precision="fp32",
                      device="cpu")
    assert [(s.model, s.context) for s in plan.specs] == [
        (None, 16), (None, 32), (TWICE, 16), (TWICE, 32)]
    assert any(TWICE in n for n in plan.notes)


def test_predict_takes_one_model():
    import lmperf

    with pytest.raises(SpecError, match="--predict takes one --model"):
        lmperf.bench(model=["reference", TWICE], predict="cpu")
