"""TFLOP/s and MFU on one FLOP convention across `--attention` (issue 19, finding 2).

Before: the meta-device count refused flash-triton (and a real step cannot see Triton kernels),
flash-torch was credited only the tiles it computes while naive and SDPA's math path got the
full T x T square. Now the counter counts the step with attention left out and the causal term
is added analytically, the same for every implementation, and the record names the convention.
"""

from __future__ import annotations

import pytest
import torch

from lmperf.kernels import NAMES
from lmperf.measure.flops import (
    FLOPS_CONVENTION, analytic_flops, attention_flops, count_flops, no_attention,
    reference_step_flops,
)
from lmperf.model.transformer import CausalSelfAttention
from lmperf.questions.bench.job import run_spec
from lmperf.questions.bench.table import display_frame
from lmperf.runtime.precision import get_regime
from lmperf.workload.build import meta_flops, prepare
from lmperf.workload.spec import RunSpec

SHAPE = dict(context=32, batch=2)


def _spec(attention: str, mode: str = "train-step") -> RunSpec:
    return RunSpec.from_size("tiny", attention=attention, mode=mode, **SHAPE)


@pytest.mark.parametrize("mode", ["forward", "train-step"])
def test_every_attention_counts_the_same_non_attention_flops(mode):
    counts = {name: meta_flops(_spec(name, mode))[0] for name in NAMES}
    assert set(counts) >= {"naive", "sdpa", "flash-torch", "flash-triton"}
    assert len(set(counts.values())) == 1, counts  # flash-triton too: it never runs on meta
    spec = _spec("naive", mode)
    est = analytic_flops(spec.d_model, spec.num_layers, spec.d_ff, spec.vocab_size,
                         spec.batch, spec.context, mode)
    assert counts["naive"] == est.matmul  # exactly the 6N part: attention left out


def test_the_step_adds_causal_attention_on_one_convention():
    spec = _spec("flash-triton")
    counted, _ = meta_flops(spec)
    fl = reference_step_flops(counted, True, spec.d_model, spec.num_layers, spec.d_ff,
                              spec.vocab_size, spec.batch, spec.context, spec.mode)
    causal = attention_flops(spec.d_model, spec.num_layers, spec.batch,
                             spec.context, spec.mode)
    assert fl.flops == counted + causal == fl.analytic
    assert fl.convention == FLOPS_CONVENTION and "causal" in fl.convention


def test_causal_is_half_the_full_square():
    full = attention_flops(64, 2, 4, 128, "forward", causal=False)
    assert full == 2 * 2 * (2 * 4 * 128 * 128 * 64)  # QK^T and PV, 2 FLOPs per multiply-add
    assert attention_flops(64, 2, 4, 128, "forward") == full // 2
    assert attention_flops(64, 2, 4, 128, "train-step") == 3 * full // 2


def test_a_real_step_count_is_labelled_as_such():
    fl = reference_step_flops(10**9, False, 64, 2, 256, 10000, 2, 32, "train-step")
    assert fl.flops == 10**9 and fl.convention != FLOPS_CONVENTION


def test_the_stand_in_keeps_every_projection_in_the_backward():
    q, k, v = (torch.randn(2, 4, 8, 16, requires_grad=True) for _ in range(3))
    total, _ = count_flops(lambda: no_attention(q, k, v).sum().backward())
    assert total == 0 and all(t.grad is not None for t in (q, k, v))


def test_the_bench_record_and_table_carry_the_convention():
    spec = RunSpec.from_size("tiny", context=16, batch=1, mode="forward", attention="flash-torch",
                             warmup=0, steps=1)
    metrics = run_spec(spec)["metrics"]
    assert metrics["flops_convention"] == FLOPS_CONVENTION
    assert metrics["flops_per_step"] == metrics["flops_per_step_analytic"]
    step_s = metrics["step_ms"]["median"] / 1e3
    assert metrics["tflops"] == pytest.approx(metrics["flops_per_step"] / step_s / 1e12)
    record = {"kind": "bench", "status": "ok", "spec": spec.to_dict(), "metrics": metrics,
              "env": {}, "params": 1}
    _, _, notes = display_frame([record])  # the convention is a note under the table
    assert f"FLOPs: {FLOPS_CONVENTION}" in notes


def test_a_run_counts_on_a_view_of_its_own_model_as_on_a_fresh_meta_build():
    # Prepared.count_flops() counts the built model through a meta view; meta_flops builds a
    # fresh model on meta: both count the same step, and the real model is left as it was.
    for mode in ("forward", "train-step"):
        spec = _spec("sdpa", mode)
        prepared = prepare(spec, torch.device("cpu"), get_regime("fp32"))
        before = [p.detach().clone() for p in prepared.state.model.parameters()]
        kernels = [m.attention for m in prepared.state.model.modules()
                   if isinstance(m, CausalSelfAttention)]
        assert prepared.count_flops()[0] == meta_flops(spec)[0] > 0
        after = list(prepared.state.model.parameters())
        assert all(torch.equal(a, b) and a.grad is None for a, b in zip(after, before))
        assert [m.attention for m in prepared.state.model.modules()
                if isinstance(m, CausalSelfAttention)] == kernels  # the stand-in is undone
