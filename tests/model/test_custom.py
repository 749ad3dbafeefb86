"""Loading a user's `package.module:factory`, building it, and checking it on the meta device."""

from __future__ import annotations

import json

import pytest
import torch

from lmperf.errors import LmperfError, ModelLoadError
from lmperf.model import ModelConfig, TransformerLM, build_model, count_params, inspect_on_meta
from lmperf.model import load_factory
from tests.model import factories

F = "tests.model.factories"
CFG = ModelConfig(vocab_size=37, context_length=12, d_model=16, num_layers=2, num_heads=4, d_ff=24)


def test_factories_module_is_importable_by_path():
    assert load_factory(f"{F}:reference") is factories.reference
    assert load_factory(f"{F}:Bigram") is factories.Bigram  # a class is a callable too


@pytest.mark.parametrize("target", [
    f"{F}.reference",          # no colon
    f"{F}:",                   # no attribute
    ":reference",              # no module
    "",
])
def test_load_factory_malformed(target):
    with pytest.raises(ModelLoadError, match="package.module:factory"):
        load_factory(target)


def test_load_factory_missing_module():
    with pytest.raises(ModelLoadError, match="cannot import") as info:
        load_factory("tests.model.no_such_module:f")
    assert isinstance(info.value.__cause__, ImportError)


def test_load_factory_module_raising_on_import():
    with pytest.raises(ModelLoadError, match="cannot import") as info:
        load_factory("tests.model.broken_import:f")
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize("attr", ["no_such_factory", "NOT_CALLABLE", "NONE_VALUE"])
def test_load_factory_missing_or_not_callable(attr):
    with pytest.raises(ModelLoadError, match=f"no callable '{attr}'"):
        load_factory(f"{F}:{attr}")


def test_model_load_error_is_an_lmperf_error():
    assert issubclass(ModelLoadError, LmperfError)


def test_build_model_reference_and_custom():
    assert isinstance(build_model(CFG), TransformerLM)
    factories.received.clear()
    model = build_model(CFG, f"{F}:bigram")
    assert isinstance(model, factories.Bigram)
    assert factories.received == [CFG]  # the factory gets the resolved config itself
    ids = torch.randint(0, 37, (2, 12))
    assert model(ids).shape == (2, 12, 37)


def test_build_model_uses_the_current_default_device():
    with torch.device("meta"):
        model = build_model(CFG, f"{F}:bigram")
    assert all(p.is_meta for p in model.parameters())


def test_build_model_non_module_raises():
    with pytest.raises(ModelLoadError, match="returned dict, not an nn.Module"):
        build_model(CFG, f"{F}:not_a_module")


def test_build_model_factory_exception_is_wrapped():
    with pytest.raises(ModelLoadError, match="KeyError") as info:
        build_model(CFG, f"{F}:factory_raises")
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("name", ["wrong_vocab", "last_position_only"])
def test_inspect_on_meta_wrong_output_raises(name):
    with pytest.raises(ModelLoadError, match=r"\(3, 12, 37\)"):
        inspect_on_meta(CFG, f"{F}:{name}", batch_size=3)


def test_inspect_on_meta_takes_the_logits_leading_a_tuple():
    # as transformers' models return them with return_dict=False (tests/model/test_hf_models.py)
    assert inspect_on_meta(CFG, f"{F}:returns_tuple", batch_size=3) == 37 * 37


def test_inspect_on_meta_forward_failure_raises():
    with pytest.raises(ModelLoadError, match="forward failed: RuntimeError"):
        inspect_on_meta(CFG, f"{F}:forward_raises", batch_size=1)


def test_inspect_on_meta_accepts_missing_meta_kernel():
    # documented: the real run checks such a model again
    assert inspect_on_meta(CFG, f"{F}:no_meta_kernel", batch_size=1) == 37 * 37


def test_inspect_on_meta_non_module_raises():
    with pytest.raises(ModelLoadError):
        inspect_on_meta(CFG, f"{F}:not_a_module", batch_size=1)


def test_inspect_on_meta_good_factories_return_param_count():
    assert inspect_on_meta(CFG, f"{F}:bigram", batch_size=2) == 37 * 37
    n_ref = count_params(TransformerLM(**CFG.as_kwargs()))
    assert inspect_on_meta(CFG, f"{F}:reference", batch_size=2) == n_ref
    assert inspect_on_meta(CFG, None, batch_size=2) == n_ref


def test_inspect_on_meta_uses_no_real_memory(monkeypatch):
    """The custom model is built on meta: a factory that checks its own device sees 'meta'."""
    seen = []

    def spy(config):
        m = factories.bigram(config)
        seen.append({p.device.type for p in m.parameters()})
        return m

    monkeypatch.setattr(factories, "spy", spy, raising=False)
    inspect_on_meta(CFG, f"{F}:spy", batch_size=1)
    assert seen == [{"meta"}]


@pytest.mark.parametrize("command", ["bench", "memory"])
def test_a_models_own_vocabulary_is_named_and_then_taken(command, tmp_path, capsys):
    """Issue 43, item 5: a model with another vocabulary is refused with the flag that fixes
    it, in one line; with that flag it runs."""
    from lmperf.cli import main

    argv = [command, "--model", f"{F}:own_vocab", "--context", "16", "--precision", "fp32",
            "--steps", "1", "--warmup", "1", "--inline", "--out", str(tmp_path / "r.jsonl")]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "give --vocab-size 512" in lines[0]
    assert main([*argv, "--vocab-size", "512"]) == 0
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert records and all(r["status"] == "ok" and r["spec"]["vocab_size"] == 512
                           for r in records)
