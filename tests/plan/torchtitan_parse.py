"""Parse lmperf's torchtitan 0.3 forms with torchtitan's own ConfigManager; print what it read.

Run by .venv-torchtitan's python (not the test environment: torchtitan imports datasets,
tensorboard and triton), as `python torchtitan_parse.py FORMS.json`: FORMS.json is a list of
{"argv": the words after `-m torchtitan.train`, "pythonpath": the line's PYTHONPATH or null}.
Prints one JSON object per form, in order, as a JSON list: the parsed settings, or
{"error": ...} for a form torchtitan refuses.
"""

from __future__ import annotations

import json
import sys
import types


def _stages(config) -> int | None:
    """The pipeline stage count torchtitan derives from the parsed config (its own rule)."""
    from torchtitan.distributed import pipeline_parallel

    p = config.parallelism
    if p.pipeline_parallel_degree == 1:
        return None
    if p.module_fqns_per_model_part is not None:
        return len(p.module_fqns_per_model_part)
    stages, *_ = pipeline_parallel._get_pipeline_metadata(
        types.SimpleNamespace(pp=p.pipeline_parallel_degree), p, config.model_spec.model)
    return stages


def _float8(model) -> str | None:
    """'rowwise' / 'tensorwise' when the blocks' linears are float8, else None; lm_head's too."""
    w1 = model.layers[0].feed_forward.w1
    scaling = getattr(getattr(w1, "_torchao_config", None), "cast_config_input", None)
    if scaling is None:
        return None
    return "rowwise" if scaling.scaling_granularity.name == "AXISWISE" else "tensorwise"


def _parameters(model_config) -> int | None:
    """The parameter count of the model torchtitan builds from `model_config` (on the meta
    device: no memory); None where it does not build there (float8's linears)."""
    import torch

    try:
        with torch.device("meta"):
            model = model_config.build()
    except Exception:  # noqa: BLE001 - a count is a bonus; the parse is the check
        return None
    return sum(p.numel() for p in model.parameters())


def settings(config) -> dict:
    """What the tests read back: degrees, batches, stages, precision, checkpointing, compile."""
    p, t, model = config.parallelism, config.training, config.model_spec.model
    return {
        "flavor": config.model_spec.flavor, "layers": len(model.layers), "dim": model.dim,
        "vocab": model.vocab_size, "dp_replicate": p.data_parallel_replicate_degree,
        "dp_shard": p.data_parallel_shard_degree, "tp": p.tensor_parallel_degree,
        "pp": p.pipeline_parallel_degree, "cp": p.context_parallel_degree,
        "pp_schedule": p.pipeline_parallel_schedule,
        "pp_microbatch": p.pipeline_parallel_microbatch_size,
        "pp_layers_per_stage": p.pipeline_parallel_layers_per_stage, "stages": _stages(config),
        "reshard_after_forward": p.fsdp_reshard_after_forward,
        "local_batch": t.local_batch_size, "global_batch": t.global_batch_size,
        "seq_len": t.seq_len, "param_dtype": t.mixed_precision_param,
        "disable_cuda_graphs": t.disable_cuda_graphs,
        "checkpoint": (type(config.activation_checkpoint).__qualname__.split(".")[0]
                       if config.activation_checkpoint is not None else None),
        "compile": config.compile.enable, "async_tp": config.compile.enable_async_tensor_parallel,
        "float8": _float8(model), "lm_head": type(model.lm_head).__qualname__,
        "hf_assets_path": config.hf_assets_path, "parameters": _parameters(model),
    }


def main(path: str) -> None:
    """Parse every form of the JSON file at `path`; print the list of settings."""
    # torchtitan's float8 converter refuses to build below SM 8.9; this parses on a CPU, so its
    # hardware check answers yes (the converter's config is what is checked, not a GPU)
    from torchtitan.components.quantization import float8
    from torchtitan.config import ConfigManager

    float8.has_cuda_capability = lambda *_: True
    out = []
    for form in json.load(open(path, encoding="utf-8")):
        if form.get("pythonpath"):
            sys.path.insert(0, form["pythonpath"])  # what PYTHONPATH= does for the line
        try:
            out.append(settings(ConfigManager().parse_args(form["argv"])))
        except (Exception, SystemExit) as e:  # tyro exits on a flag it does not know
            out.append({"error": f"{type(e).__name__}: {e}"})
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
