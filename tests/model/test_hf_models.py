"""A Hugging Face `transformers` Llama through every path that takes `--model`: the output check,
a bench run, memory measured, the simulated estimate (phantom tensors) and the op counts of
`bench --predict` (fake tensors). Skipped where transformers is not installed."""

from __future__ import annotations

import contextlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

from examples.hf_llama import llama_config  # noqa: E402
from lmperf.estimate.simulate import simulate_step  # noqa: E402
from lmperf.model.checks import check_output, count_params, inspect_on_meta  # noqa: E402
from lmperf.model.custom import build_model  # noqa: E402
from lmperf.workload.spec import RunSpec  # noqa: E402

MODEL = "tests.model.test_hf_models:tiny_llama"
D, L, H, HKV, FF, V, T, B = 64, 2, 4, 2, 256, 1000, 32, 2


def tiny_llama(config) -> torch.nn.Module:
    """The example's Llama with 4 query heads sharing 2 K/V heads (grouped-query attention)."""
    cfg = llama_config(config)
    cfg.num_key_value_heads = HKV
    return transformers.LlamaForCausalLM(cfg)


class _Tuple(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.llama = tiny_llama(config)

    def forward(self, ids: torch.Tensor) -> tuple:
        return self.llama(ids, return_dict=False)  # (logits,): what return_dict=False returns


def tiny_llama_tuple(config) -> torch.nn.Module:
    """The same model returning a tuple led by the logits."""
    return _Tuple(config)


def _spec(model: str = MODEL, **kw) -> RunSpec:
    kw = {"context": T, "batch": B, "optimizer": "foreach", **kw}
    return RunSpec.from_size("tiny", vocab_size=V, model=model, **kw)


# Matrix-product parameters of one forward: q and o (D x D), k and v (D x D*HKV/H), gate, up
# and down (D x FF) per layer, and the output head (D x V).
MATMUL_PARAMS = L * (2 * D * D + 2 * D * D * HKV // H + 3 * D * FF) + D * V


@pytest.mark.parametrize("factory", ["tiny_llama", "tiny_llama_tuple"])
def test_its_output_is_taken_as_logits_on_meta_and_on_the_cpu(factory):
    spec = _spec(f"tests.model.test_hf_models:{factory}")
    n = inspect_on_meta(spec.model_config(), spec.model, B, T)  # a value read on meta: answered
    model = build_model(spec.model_config(), spec.model)
    assert n == count_params(model) == MATMUL_PARAMS + V * D + (2 * L + 1) * D  # + emb, norms
    check_output(model, torch.zeros(B, T, dtype=torch.long), contextlib.nullcontext, V, spec.model)
    assert model(torch.zeros(B, T, dtype=torch.long)).shape == (B, T, V)


def test_a_bench_run_inline():
    from lmperf.questions.bench.job import run_spec

    rec = run_spec(_spec(warmup=1, steps=2))
    assert rec["status"] == "ok", rec["message"]
    assert rec["params"] == MATMUL_PARAMS + V * D + (2 * L + 1) * D
    assert rec["metrics"]["step_ms"]["n"] == 2 and rec["metrics"]["flops_per_step"] > 0


def test_memory_measured_per_phase_and_saved_tensors():
    from lmperf.questions.memory.job import run_job
    from lmperf.questions.memory.spec import MemorySpec

    run = _spec(warmup=1, steps=1)
    phases = run_job(MemorySpec.from_run(run, analysis="phases", contexts=(T,),
                                         modes=("train-step",)))
    saved = run_job(MemorySpec.from_run(run, analysis="saved", contexts=(T,)))
    assert [r["status"] for r in phases + saved] == ["ok", "ok"], phases + saved
    assert saved[0]["metrics"]["saved"]["activation_bytes"] > 0


@pytest.mark.parametrize("attention, precision, mode", [
    ("sdpa", "fp32", "train-step"), ("naive", "bf16-mixed", "forward")])
def test_the_simulated_peak_is_memtrackers_on_real_tensors(attention, precision, mode):
    pytest.importorskip("torch.distributed._tools.mem_tracker")
    from tests.memory.memtracker import memtracker_peak

    spec = _spec(attention=attention, precision=precision, mode=mode)
    assert simulate_step(spec).peak_bytes == memtracker_peak(spec)


def test_checkpointing_every_layer_is_transformers_own_and_keeps_fewer_activations():
    from lmperf.errors import SpecError

    spec = _spec(attention="sdpa", mode="forward-backward")  # the peak is backward's
    off, every = (simulate_step(spec, g) for g in ("none", "full"))
    assert every.peak_bytes < off.peak_bytes
    assert every.composition["activations"] < off.composition["activations"]
    for policy in (2, "op", "every-2"):
        with pytest.raises(SpecError, match="checkpoints full .every layer. or none"):
            simulate_step(spec, policy)


def test_op_counts_and_a_prediction_on_fake_tensors():
    from lmperf.estimate.op_costs import count_op_costs
    from lmperf.questions.bench import predict as pr

    spec = _spec(mode="forward", device="cuda")
    table = count_op_costs(spec).table
    matmul = table.loc[table["op_class"] == "matmul", "flops"].sum()
    # the linear layers, and QK^T and PV (transformers 5.4 also counts RoPE's angles, an
    # outer product of 2 x B x T x D/H/2 FLOPs)
    expected = 2 * B * T * MATMUL_PARAMS + L * 2 * 2 * B * T * T * D
    assert expected <= matmul <= expected + B * T * D // H
    (record,) = pr.predict([spec.with_(device="cpu")], ["H100-SXM"])
    assert record["status"] == "ok" and record["metrics"]["forward"]["flops"] > 0


def test_a_plan_for_it_on_gpus(capsys):
    """`lmperf plan --model`: candidates simulated and timed; its checkpointing is every layer
    (transformers' own) or none, so larger groups are left out, not an error."""
    import lmperf

    report = lmperf.plan(model=MODEL, size="tiny", gpu="A100-80GB", gpus=2, context=32,
                         global_batch=4, checkpoint=["none", "full", 2], precision="bf16-mixed")
    specs = [r["spec"] for r in report.records]
    assert specs and {s["checkpoint"] for s in specs} == {"none", "full"}
    assert all(r["metrics"]["fits"] for r in report.records)
    # neither dist train nor torchtitan builds a user's model: the line says so, and how
    run_it = [h for h in report.headline if h.startswith("run it")]
    assert run_it and "no command" in run_it[0] and "torchtitan cannot build" in run_it[0]
