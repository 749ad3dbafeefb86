"""One configuration in process: memory before backward counted exactly, timings kept raw."""

from __future__ import annotations

import pytest
import torch

from lmperf import kernels
from lmperf.questions.attention.job import make_inputs, memory_before_backward, run_spec
from lmperf.questions.attention.spec import AttnSpec

QUICK = dict(warmup=0, steps=2)


def _memory(spec: AttnSpec) -> int:
    q, k, v, _ = make_inputs(spec, torch.device("cpu"))
    fn = kernels.get(spec.attention)
    return memory_before_backward(lambda: fn(q, k, v, spec.causal), torch.device("cpu"),
                                  (q, k, v))["before_backward_bytes"]


@pytest.mark.parametrize("causal", [True, False])
def test_naive_memory_is_the_saved_tensors_counted_by_hand(causal):
    b, h, t, d = 2, 3, 40, 8
    spec = AttnSpec("naive", context=t, d=d, batch=b, heads=h, causal=causal)
    P = spec.score_matrix_bytes()  # (B, H, T, T) fp32
    assert P == b * h * t * t * 4
    row = b * h * t * 4  # one (B, H, T, 1) fp32 reduction
    # The reference model's naive attention keeps, q, k, v aside:
    #   where(mask, s, -inf) -> the mask (T x T bool causal; a 0-dim bool when not causal)
    #   amax(s)              -> its input, the masked scores (P), and its result (row)
    #   exp(s - max)         -> its result e (P)
    #   e / sum(e)           -> e (already counted) and the sum (row)
    #   einsum(probs, v)     -> the probabilities (P)
    # plus the output o (B, H, T, d), alive until backward.
    mask = t * t if causal else 1
    assert _memory(spec) == 3 * P + mask + 2 * row + spec.qkv_bytes()


def test_flash_torch_keeps_only_the_output_and_the_logsumexp():
    spec = AttnSpec("flash-torch", context=100, d=16, batch=2, heads=2)  # 100: not a tile multiple
    assert _memory(spec) == spec.qkv_bytes() + 2 * 2 * 100 * 4  # o + L (B, H, T) fp32


@pytest.mark.parametrize("context", [1024, 2048])
def test_flash_torch_saves_at_least_a_probability_matrix_over_naive(context):
    naive, flash = (AttnSpec(i, context=context, d=64) for i in ("naive", "flash-torch"))
    saved = _memory(naive) - _memory(flash)
    assert saved >= naive.score_matrix_bytes()


def test_an_ok_record_keeps_raw_samples_of_three_passes_and_the_analytic_matrix():
    spec = AttnSpec("sdpa", context=32, d=16, **QUICK)
    r = run_spec(spec)
    assert r["kind"] == "attention" and r["status"] == "ok", r["message"]
    m = r["metrics"]
    for p in ("forward", "backward", "end_to_end"):
        assert len(m[f"{p}_ms"]["samples"]) == 2 and m[f"{p}_ms"]["median"] > 0
    assert m["timer"].startswith("perf_counter")
    assert m["analytic"]["score_matrix_bytes"] == 32 * 32 * 4
    assert m["memory"]["x_score_matrix"] == pytest.approx(m["memory"]["before_backward_bytes"] / 4096)
    assert m["sdpa_backend"]
    assert spec.to_dict() == r["spec"]


def test_flash_triton_without_the_interpreter_is_an_unsupported_row(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    r = run_spec(AttnSpec("flash-triton", context=32, d=16, **QUICK))
    assert r["status"] == "unsupported"
    assert "TRITON_INTERPRET" in r["message"] or "triton" in r["message"]
    assert r["metrics"]["analytic"]["score_matrix_mib"] == 32 * 32 * 4 / 2**20


def test_the_launcher_sets_the_spec_s_threads_and_restores_them():
    from lmperf.core.launch import run_inline

    before = torch.get_num_threads()
    (r,) = run_inline(AttnSpec("naive", context=16, d=16, threads=1, **QUICK))
    assert r["status"] == "ok" and r["env"]["torch_threads"] == 1 and r["job_id"]
    assert torch.get_num_threads() == before


def test_a_failure_is_recorded_by_the_core_s_outcome(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(kernels, "get", lambda name, validate=True: boom)
    r = run_spec(AttnSpec("naive", context=16, d=16, **QUICK))
    assert r["status"] == "error"
    assert r["message"].startswith("RuntimeError while timing the forward")
    assert "traceback" in r and r["metrics"]["analytic"]
