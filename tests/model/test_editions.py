"""Course editions: what each size name means in CS336 2025 and 2026, parameter counts pinned
with the course model's independent re-implementation on the meta device, and every record
saying which edition defined its size."""

from __future__ import annotations

import json

import pytest
import torch

from lmperf.cli import main
from lmperf.core.vocabulary import OPTIONS, device_defaults
from lmperf.errors import SpecError
from lmperf.model import DEFAULT_COURSE, EDITIONS, VOCAB_SIZE, count_params, resolve_preset
from lmperf.workload.spec import RunSpec
from tests.model.reference import ReferenceLM

# Counted once with ReferenceLM (tests/model/reference.py, the course's BasicsTransformerLM
# written independently of lmperf) on the meta device, and pinned here.
PARAMS = {
    ("2025", "small"): 128_625_408, ("2025", "medium"): 423_183_360,
    ("2025", "large"): 969_411_840, ("2025", "xl"): 1_998_235_200,
    ("2025", "2.7B"): 3_406_809_600, ("2025", "10B"): 12_832_823_808,
    ("2026", "small"): 128_625_408, ("2026", "medium"): 423_183_360,
    ("2026", "large"): 969_411_840, ("2026", "xl"): 3_406_809_600,
    ("2026", "10B"): 12_832_823_808, ("2026", "leaderboard"): 8_125_698_048,
}
SHAPES_2026 = {  # d_model, d_ff, layers, heads (the 2026 handout)
    "xl": (2560, 10240, 32, 32), "10B": (4608, 12288, 50, 36), "leaderboard": (4096, 11008, 34, 32),
}


def reference_count(course: str, size: str) -> int:
    p = resolve_preset(size, course)
    with torch.device("meta"):
        model = ReferenceLM(vocab_size=p.vocab_size or VOCAB_SIZE, context_length=8,
                            d_model=p.d_model, num_layers=p.num_layers, num_heads=p.num_heads,
                            d_ff=p.d_ff)
    return sum(t.numel() for t in model.parameters())


@pytest.mark.parametrize("course, size", sorted(PARAMS))
def test_counts_equal_the_course_model(course, size):
    assert reference_count(course, size) == PARAMS[(course, size)]
    spec = RunSpec.from_size(size, course, context=8)
    from lmperf.model import build_model

    with torch.device("meta"):
        ours = build_model(spec.model_config(), None)
    assert count_params(ours) == PARAMS[(course, size)]


def test_2026_shapes_and_what_changed():
    for size, shape in SHAPES_2026.items():
        p = resolve_preset(size, "2026")
        assert (p.d_model, p.d_ff, p.num_layers, p.num_heads) == shape
    assert resolve_preset("leaderboard", "2026").vocab_size == 151_936
    assert resolve_preset("xl", "2025").d_model == 1600 and resolve_preset("xl", "2025").num_layers == 48
    assert "2.7B" not in EDITIONS["2026"] and "leaderboard" not in EDITIONS["2025"]


def test_a_name_from_the_other_edition_says_where_it_lives():
    with pytest.raises(SpecError, match=r"'2.7B' in the 2026 edition \(it is a size of the 2025 edition"):
        RunSpec.from_size("2.7B", "2026")
    with pytest.raises(SpecError, match="unknown course"):
        RunSpec.from_size("xl", "2024")


def test_the_default_edition_and_cuda_defaults():
    assert DEFAULT_COURSE == "2026" == OPTIONS["course"].default
    assert device_defaults("bench", "cuda", "2026")["size"] == ["small", "medium", "large", "xl", "10B"]
    assert device_defaults("bench", "cuda", "2026")["context"] == [512]
    assert device_defaults("bench", "cuda", "2025")["size"][-1] == "2.7B"
    assert device_defaults("memory", "cuda", "2026") ["context"] == [128, 2048]
    assert device_defaults("bench", "cpu", "2025") == device_defaults("bench", "cpu", "2026")


def test_records_written_before_editions_read_as_2025():
    spec = RunSpec.from_size("xl", "2025", context=8)
    old = {k: v for k, v in spec.to_dict().items() if k != "course"}
    assert RunSpec.from_dict(old).course == "2025"


@pytest.mark.parametrize("course, d_model, layers", [("2026", 2560, 32), ("2025", 1600, 48)])
def test_memory_estimate_reports_the_editions_shape(course, d_model, layers, tmp_path, capsys):
    code = main(["memory", "--course", course, "--size", "xl", "--context", "128", "--estimate",
                 "--json", "--out", str(tmp_path / "m.jsonl")])
    records = json.loads(capsys.readouterr().out)  # one per mode the estimate simulates
    assert code == 0 and records
    for record in records:
        assert record["spec"]["course"] == course
        assert (record["spec"]["d_model"], record["spec"]["num_layers"]) == (d_model, layers)
        assert record["params"] == PARAMS[(course, "xl")]


def test_every_record_says_its_edition(tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    assert main(["bench", "--size", "tiny", "--context", "16", "--mode", "forward", "--steps", "1",
                 "--warmup", "0", "--precision", "fp32", "--inline", "--course", "2025",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["spec"]["course"] == "2025"
    text = capsys.readouterr().out
    assert "course 2025" in text and "d=64 L=2 H=4 ff=256" in text  # the shape is always shown
