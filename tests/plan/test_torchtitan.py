"""A plan's job on torchtitan 0.3 (issues 40, 41): the emitter's forms, and each form parsed by
torchtitan 0.3's own ConfigManager in .venv-torchtitan (.ci/torchtitan-env.sh) with every
planned setting read back from the parsed config."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lmperf.questions.plan.torchtitan import _stages, job, module_path, write_beside

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-torchtitan" / "bin" / "python"
SEARCH = "20261207-101010-ab12"
REQUEST = dict(course="2026", model=None, gpus_per_node=8, gpu="H100-SXM", search=SEARCH)
CANDIDATE = dict(precision="bf16-fsdp", strategy="fsdp", tp=1, pp=1, cp=1, dp_replicate=1,
                 pp_schedule=None, pp_virtual=1, grad_accum=1, async_tp=False, float8="none",
                 compile=False, checkpoint=1)
# the cases, and a few more that 0.3 expresses otherwise than the plan
CASES = {
    "fsdp_8b": dict(size="llama3-8b", context=8192, global_batch=16, gpus=8, dp_shard=8,
                    micro_batch=2),
    "pp_405b": dict(size="llama3-405b", context=8192, global_batch=256, gpus=512, dp_shard=8,
                    tp=8, pp=8, pp_schedule="Interleaved1F1B", pp_virtual=2, micro_batch=4),
    "cp_8b": dict(size="llama3-8b", context=131072, global_batch=2, gpus=8, dp_shard=2, cp=4,
                  micro_batch=1),
    "async_tp_70b": dict(size="llama3-70b", context=8192, global_batch=64, gpus=256,
                         dp_shard=32, tp=8, micro_batch=2, async_tp=True, compile=True),
    "float8_8b": dict(size="llama3-8b", context=8192, global_batch=32, gpus=8, dp_shard=8,
                      micro_batch=4, float8="rowwise", compile=True),
    "op_mini": dict(size="mini", context=256, global_batch=16, gpus=2, dp_shard=2,
                    micro_batch=8, checkpoint="op"),
    "model": dict(size=None, model="examples.hf_llama:llama", context=4096, global_batch=8,
                  gpus=4, dp_shard=4, micro_batch=2),
    # stages no layers_per_stage makes (34 weighted layers in 8), listed; HSDP x zero2-like
    "pp_8b_listed": dict(size="llama3-8b", context=8192, global_batch=16, gpus=8, dp_shard=2,
                         pp=4, pp_schedule="Interleaved1F1B", pp_virtual=2, micro_batch=2),
    "ddp_1b_fp32": dict(size="llama3-1b", context=2048, global_batch=16, gpus=8, dp_shard=1,
                        dp_replicate=8, strategy="ddp", precision="fp32", micro_batch=1,
                        grad_accum=2, checkpoint=0),
    "zero2_405b_float8": dict(size="llama3-405b", context=8192, global_batch=64, gpus=256,
                              dp_shard=32, tp=8, strategy="zero2", micro_batch=1, grad_accum=2,
                              float8="tensorwise", compile=True, checkpoint=2),
    "hsdp_3b_every2": dict(size="llama3-3b", context=4096, global_batch=64, gpus=16,
                           dp_replicate=2, dp_shard=8, micro_batch=2, grad_accum=2,
                           precision="bf16-mixed",
                           checkpoint="every-2", float8="rowwise"),
}
CHECKPOINT = {0: None, 1: "FullAC", 2: "FullAC", "none": None, "full": "FullAC",
              "op": "SelectiveAC", "every-2": "FullAC"}  # lmperf's -> the class 0.3 parses


def _spec(name: str) -> dict:
    return {**REQUEST, **CANDIDATE, **CASES[name]}


def _argv(line: str) -> tuple[list[str], str | None]:
    """(the words after `-m torchtitan.train`, the line's PYTHONPATH or None)."""
    words = shlex.split(line)
    path = words[0].split("=", 1)[1] if words[0].startswith("PYTHONPATH=") else None
    return words[words.index("torchtitan.train") + 1:], path


# --- the emitter, no torchtitan -------------------------------------------------------------

def test_the_8b_plan_is_torchtitans_own_recipe_overridden() -> None:
    line, text, notes = job(_spec("fsdp_8b"))
    assert text is None and line == (
        "torchrun --nnodes=1 --nproc_per_node=8 -m torchtitan.train --module llama3 --config "
        "llama3_8b --parallelism.data_parallel_shard_degree 8 --parallelism.tensor_parallel_degree"
        " 1 --training.local_batch_size 2 --training.global_batch_size 16 --training.seq_len 8192"
        " --training.mixed_precision_param bfloat16 --compile.no-enable activation-checkpoint:full")
    assert notes == []  # torchtitan runs the plan as planned


def test_what_a_config_function_sets_is_a_module_beside_the_records(tmp_path) -> None:
    spec = _spec("pp_405b")
    out = write_beside(spec, tmp_path / "plan.jsonl")
    path = Path(out["torchtitan_config"])
    assert path.parent == tmp_path and path.name == f"plan_{SEARCH.replace('-', '_')}_torchtitan.py"
    assert re.fullmatch(r"[A-Za-z_]\w*", path.stem)  # --module imports it by name
    line = out["torchtitan_command"]
    assert line.startswith(f"PYTHONPATH={tmp_path} torchrun --nnodes=64 --nproc_per_node=8 "
                           "--rdzv-backend=c10d --rdzv-endpoint=HOST:29500 -m torchtitan.train "
                           f"--module {path.stem} --config lmperf_plan ")
    text = path.read_text()
    # 405B without float8: llama3_405b() would convert to float8, so 70B's recipe and 405B's
    # model and optimizer
    assert "config = llama3_70b()" in text and 'model_registry("405B")' in text
    assert "default_adamw(lr=8e-5)" in text and line in text
    assert "--parallelism.pipeline_parallel_layers_per_stage 8 " in line  # 128 / 8 = 16 stages
    assert "--training.local_batch_size 32 " in line  # 256 / 8 replicas, in micro-batches of 4
    assert "--training.disable_cuda_graphs" in line
    assert out["torchtitan_notes"][0].endswith("the config module at this path on each")
    assert not (tmp_path / "x.jsonl").exists() and write_beside(_spec("fsdp_8b"), None).keys() \
        == {"torchtitan_command", "torchtitan_notes"}


def test_without_a_results_path_the_line_names_the_module_to_come() -> None:
    line, text, notes = job(_spec("float8_8b"))
    assert line.startswith("PYTHONPATH=DIR torchrun ") and "--module MODULE --config" in line
    assert text is not None and "DIR/MODULE.py" in notes[0]
    assert module_path("r/1plan.jsonl", "a-b").name == "m1plan_a_b_torchtitan.py"


def test_what_torchtitan_cannot_express_gets_the_nearest_and_a_note() -> None:
    line, text, notes = job(_spec("zero2_405b_float8"))
    said = " | ".join(notes)
    assert "--parallelism.fsdp_reshard_after_forward never" in line
    assert "torchtitan has no zero2: FSDP is nearest" in said
    assert "no tensorwise float8: rowwise is nearest" in said
    assert "groups of 2 blocks" in said and line.endswith("activation-checkpoint:full")
    assert text is None and "--config llama3_405b" in line  # its own float8, compiled
    _, text, notes = job(_spec("hsdp_3b_every2"))
    said = " | ".join(notes)
    assert "no autocast" in said and "one block in 2" in said
    assert 'model_registry("3B", converters=[float8])' in text
    assert 'recipe_name="rowwise"' in text and "model_compile_enabled=False" in text


def test_a_users_model_has_no_torchtitan_form() -> None:
    line, text, notes = job(_spec("model"))
    assert line is None and text is None
    assert notes == ["torchtitan cannot build your model examples.hf_llama:llama: no torchtitan "
                     "form (port it to a torchtitan model with a config_registry)"]


def test_unequal_micro_batches_keep_the_global_batch() -> None:
    spec = {**_spec("fsdp_8b"), "gpus": 16, "dp_shard": 2, "tp": 8, "micro_batch": 5,
            "grad_accum": 2}
    line, _, notes = job(spec)
    assert "--training.local_batch_size 4 --training.global_batch_size 16 " in line
    assert "leave a last one of 3; torchtitan's are equal: 2 of 4" in " | ".join(notes)


def test_a_record_from_before_layouts_reads_as_one_pipeline_and_context_rank() -> None:
    old = {"size": "llama3-8b", "course": "2026", "model": None, "gpus": 16, "context": 8192,
           "global_batch": 16, "precision": "bf16-fsdp", "strategy": "ddp", "tp": 2,
           "micro_batch": 1, "grad_accum": 2, "checkpoint": 1, "search": SEARCH}
    line, _, _ = job(old)
    assert "--parallelism.data_parallel_replicate_degree 8 --parallelism.data_parallel_shard_" \
        "degree 1 --parallelism.tensor_parallel_degree 2 " in line
    assert "--nnodes=2" in line and "pipeline" not in line
    with pytest.raises(ValueError, match="do not make 16 GPUs"):
        job({**old, "dp_shard": 3, "dp_replicate": 1})


def test_the_stage_split_is_torchtitans() -> None:
    assert _stages(126, 16) == ("--parallelism.pipeline_parallel_layers_per_stage 8", [])
    flag, notes = _stages(32, 8)
    parts = [p.split(",") for p in flag.split()[1:]]
    assert len(parts) == 8 and notes
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    blocks = [n for p in parts for n in p if n.startswith("layers.")]
    assert blocks == [f"layers.{i}" for i in range(32)]
    # 34 weighted layers: 5 5 4 4 4 4 4 4, the embedding and the head each one of them
    assert [len(p) for p in parts] == [5, 5, 4, 4, 4, 4, 4, 5]


# --- torchtitan 0.3 parses every form -------------------------------------------------------

@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict[str, dict]:
    """Each case's settings as torchtitan 0.3's ConfigManager parsed its form (one process)."""
    if not PYTHON.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{PYTHON} is missing: .ci/run builds it (.ci/torchtitan-env.sh)")
        pytest.skip(".venv-torchtitan not built (bash .ci/torchtitan-env.sh; under CI=true "
                    "this fails instead)")
    here = tmp_path_factory.mktemp("torchtitan")
    names, forms = [], []
    for name in CASES:
        out = write_beside({**_spec(name), "search": f"{SEARCH}-{name}"}, here / "plan.jsonl")
        if out["torchtitan_command"]:
            argv, path = _argv(out["torchtitan_command"])
            names.append(name)
            forms.append({"argv": argv, "pythonpath": path})
    (here / "forms.json").write_text(json.dumps(forms))
    done = subprocess.run([str(PYTHON), str(Path(__file__).with_name("torchtitan_parse.py")),
                           str(here / "forms.json")], capture_output=True, text=True,
                          timeout=300, cwd=here)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(names, json.loads(done.stdout)))


@pytest.mark.parametrize("name", [n for n in CASES if n != "model"])
def test_torchtitan_reads_back_every_planned_setting(parsed, name) -> None:
    got, s = parsed[name], _spec(name)
    assert "error" not in got, got.get("error")
    dp = s["dp_replicate"] * s["dp_shard"]
    assert (got["dp_replicate"], got["dp_shard"], got["tp"], got["pp"], got["cp"]) == (
        s["dp_replicate"], s["dp_shard"], s["tp"], s["pp"], s["cp"])
    assert got["global_batch"] == s["global_batch"] and got["seq_len"] == s["context"]
    if s["pp"] > 1:  # the rank's batch in pipeline micro-batches; pp x virtual stages
        assert got["local_batch"] == s["global_batch"] // dp
        assert got["pp_microbatch"] == s["micro_batch"] and got["disable_cuda_graphs"]
        assert got["pp_schedule"] == s["pp_schedule"]
        assert got["stages"] == s["pp"] * s["pp_virtual"]
    else:  # torchtitan's accumulation: global / (local x dp)
        assert got["local_batch"] == s["micro_batch"]
        assert got["global_batch"] // (got["local_batch"] * dp) == s["grad_accum"]
    assert got["checkpoint"] == CHECKPOINT[s["checkpoint"]]
    assert got["compile"] == (s["compile"] or s["async_tp"]) and got["async_tp"] == s["async_tp"]
    assert got["float8"] == (None if s["float8"] == "none" else "rowwise")
    assert got["param_dtype"] == ("float32" if s["precision"] == "fp32" else "bfloat16")
    assert got["reshard_after_forward"] == ("never" if s["strategy"] == "zero2" else "default")


def test_torchtitan_builds_the_planned_model(parsed) -> None:
    """The flavor torchtitan builds has the preset's shape and parameter count (on the meta
    device), lmperf's own `mini` included."""
    from lmperf.model.presets import resolve_preset

    counts = {"fsdp_8b": 8_030_261_248, "pp_405b": 405_853_388_800,
              "async_tp_70b": 70_553_706_496, "ddp_1b_fp32": 1_235_814_400,
              "op_mini": 3_609_728}  # Llama 3's published 8.03B, 405.9B, 70.6B, 1.24B; mini's
    for name, got in parsed.items():
        s = _spec(name)
        if "405b" not in s["size"]:  # a preset being added as this is written
            p = resolve_preset(s["size"], "2026")
            assert (got["layers"], got["dim"], got["vocab"]) == (
                p.num_layers, p.d_model, p.vocab_size or 10_000)
        if name in counts:
            assert got["parameters"] == counts[name], name
    assert parsed["op_mini"]["flavor"] == "lmperf-mini"
    assert parsed["zero2_405b_float8"]["lm_head"] == "Linear.Config"  # float8 skips it
