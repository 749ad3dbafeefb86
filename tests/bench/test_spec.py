"""RunSpec validation, identity and grid expansion."""

from __future__ import annotations

import pytest

from lmperf.workload.spec import Grid, RunSpec
from lmperf.errors import SpecError
from lmperf.results.store import spec_key


def test_from_size_fills_the_preset_shape():
    spec = RunSpec.from_size("small", context=256)
    assert (spec.d_model, spec.num_layers, spec.num_heads, spec.d_ff) == (768, 12, 12, 3072)
    assert spec.model_context == 256  # defaults to the run's context
    assert spec.vocab_size == 10_000


@pytest.mark.parametrize("field, value, fragment", [
    ("precision", "fp8", "unknown precision 'fp8'; accepted: fp32, tf32"),
    ("mode", "backward", "unknown mode 'backward'; accepted: forward, forward-backward, train-step"),
    ("attention", "flash", "unknown attention 'flash'; accepted:"),
    ("optimizer", "sgd", "unknown optimizer 'sgd'"),
    ("batch", 0, "batch must be a positive integer, got 0"),
    ("steps", -1, "steps must be a positive integer, got -1"),
    ("warmup", -1, "warmup must be a non-negative integer, got -1"),
    ("threads", -2, "threads must be a non-negative integer, got -2"),
    ("clip", -1.0, "clip must be a non-negative number"),
    ("context", 0, "context must be a positive integer"),
])
def test_bad_fields_are_rejected_with_what_is_accepted(field, value, fragment):
    with pytest.raises(SpecError, match=None) as info:
        RunSpec.from_size("tiny", **{field: value})
    assert fragment in str(info.value)


def test_unknown_size_lists_the_presets():
    with pytest.raises(SpecError, match="unknown size 'huge' in the 2026 edition; accepted: tiny, mini"):
        RunSpec.from_size("huge")


def test_context_longer_than_the_model_allows():
    with pytest.raises(SpecError, match="context 512 is longer than the model allows"):
        RunSpec.from_size("tiny", context=512, model_context=256)
    assert RunSpec.from_size("tiny", context=128, model_context=256).context == 128


def test_spec_is_frozen_hashable_and_round_trips():
    spec = RunSpec.from_size("mini", precision="bf16-mixed", mode="forward")
    with pytest.raises(Exception):
        spec.batch = 8  # type: ignore[misc]
    again = RunSpec.from_dict(spec.to_dict())
    assert again == spec and hash(again) == hash(spec)
    assert spec_key("bench", spec.to_dict()) == spec_key("bench", again.to_dict())
    assert spec_key("bench", spec.to_dict()) != spec_key("bench", spec.with_(seed=1).to_dict())


def test_grid_is_the_cartesian_product_in_size_major_order():
    grid = Grid(sizes=["tiny", "mini"], contexts=[16, 32], batches=[1], precisions=["fp32", "bf16-mixed"],
                modes=["forward"], attentions=["naive", "sdpa"], fixed={"steps": 2})
    specs = grid.expand()
    assert len(specs) == 2 * 2 * 2 * 2
    assert [s.size for s in specs[:8]] == ["tiny"] * 8
    assert {(s.context, s.precision, s.attention) for s in specs[:8]} == {
        (c, p, a) for c in (16, 32) for p in ("fp32", "bf16-mixed") for a in ("naive", "sdpa")}
    assert all(s.steps == 2 for s in specs)


def test_warmup_zero_is_valid_and_a_sweep_axis():
    from lmperf.workload.spec import Grid

    grid = Grid(sizes=["tiny"], contexts=[64], batches=[1], precisions=["fp32"], modes=["forward"],
                attentions=["naive"], warmups=[0, 1, 2])
    assert [s.warmup for s in grid.expand()] == [0, 1, 2]


def test_records_written_before_a_field_existed_still_load():
    spec = RunSpec.from_size("tiny")
    old = {k: v for k, v in spec.to_dict().items() if k not in ("threads", "clip")}
    assert RunSpec.from_dict(old) == spec.with_(threads=0, clip=1.0)
    with pytest.raises(SpecError, match="unknown RunSpec field"):
        RunSpec.from_dict({**old, "bogus": 1})
