"""One rule for the shape a --model factory gets without --size, in every command."""

from __future__ import annotations

import pytest

from lmperf.core.vocabulary import MODEL_SIZE
from lmperf.model.presets import EDITIONS, DEFAULT_COURSE
from lmperf.questions.bench.plan import plan_bench
from lmperf.questions.memory.api import memory
from lmperf.questions.memory.plan import plan_memory

MODEL = "tests.fixtures.models:reference"
PRESET = EDITIONS[DEFAULT_COURSE][MODEL_SIZE]
MEMORY = dict(size=None, model=MODEL, context=None, batch=2, precision=None,
              mode=["forward"], attention="naive", optimizer="auto", warmup=1, steps=1, seed=0,
              threads=None, model_context=0, gib=None, checkpoint=None, top=5,
              course=DEFAULT_COURSE)


def _dims(spec) -> tuple[int, int, int, int]:
    return spec.d_model, spec.num_layers, spec.num_heads, spec.d_ff


@pytest.mark.parametrize("device, estimate", [("cpu", False), ("cpu", True), ("cuda", True)])
def test_bench_and_memory_hand_the_factory_the_same_shape(device, estimate):
    bench = plan_bench(model=MODEL, device="cpu")
    mem = plan_memory(device=device, estimate=estimate, **MEMORY)
    expected = (PRESET.d_model, PRESET.num_layers, PRESET.num_heads, PRESET.d_ff)
    assert {_dims(s) for s in bench.specs} == {expected}
    assert _dims(mem.base) == expected and mem.base.size == MODEL_SIZE
    assert any(f"{MODEL_SIZE}'s shape" in n for n in bench.notes)


def test_memory_estimate_names_the_shape_it_estimated():
    report = memory(model=MODEL, estimate=True, gpu="RTX-4090", context=128, mode="forward")
    said = report.findings[0]  # what it built, read off the module, and the shape it was handed
    assert said.startswith(f"model {MODEL}: d={PRESET.d_model} L={PRESET.num_layers} ")
    assert f"its factory built when handed {MODEL_SIZE}'s shape, d={PRESET.d_model} " in said
