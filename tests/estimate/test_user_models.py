"""Users' models as they write them: a transformers Llama built from a default LlamaConfig (KV
cache on, grouped-query attention) through --model, estimated by `memory --estimate` and
`plan` (issue 35). Skipped where transformers is not installed."""

from __future__ import annotations

import pytest
import torch

from lmperf.cli import main
from lmperf.estimate.phantom import PhantomMode

transformers = pytest.importorskip("transformers")

MODEL = "tests.estimate.test_user_models:llama"


def llama(config) -> torch.nn.Module:
    """What a user writes: LlamaConfig's defaults (use_cache=True) at small sizes, 4 query heads
    on 2 K/V heads."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=config.context_length))


def _no_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert not [line for line in lines if "error" in line.lower() or "Traceback" in line], lines
    return captured.out


def test_memory_estimate_answers(capsys, tmp_path):
    assert main(["memory", "--model", MODEL, "--estimate", "--context", "32",
                 "--out", str(tmp_path / "m.jsonl")]) == 0
    assert "simulated" in _no_error_line(capsys)


@pytest.mark.slow
def test_plan_on_two_cpu_ranks_answers(capsys, tmp_path):
    assert main(["plan", "--model", MODEL, "--device", "cpu", "--gpus", "2", "--gib", "1",
                 "--context", "32", "--global-batch", "4", "--out", str(tmp_path / "p.jsonl")]) == 0
    assert "winner" in _no_error_line(capsys)


def test_an_empty_real_tensor_costs_the_simulation_nothing():
    with PhantomMode(torch.device("cpu")) as mode:
        x = torch.zeros(3) + torch.tensor([])[:0].sum()  # a real (0,) tensor reaches an op
    assert tuple(x.shape) == (3,) and mode.ops >= 2
