"""The one run envelope (`core.envelope.measured`): every outcome is a record, fields kept."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pytest

from lmperf.core.envelope import Run, measured
from lmperf.errors import SpecError


@dataclass(frozen=True)
class Job:
    device: str = "cpu"
    size: int = 3

    def to_dict(self) -> dict:
        return asdict(self)


def test_ok_record_carries_the_body_fields_the_kept_fields_and_the_environment():
    def body(spec: Job, run: Run) -> dict:
        run.warnings.append("noisy")
        return {"params": spec.size, "metrics": {"x": 1.0}}

    rec = measured("demo", Job(), body, fields={"corpus": "c"})
    assert rec["status"] == "ok" and rec["kind"] == "demo"
    assert rec["spec"] == {"device": "cpu", "size": 3}
    assert rec["params"] == 3 and rec["metrics"] == {"x": 1.0} and rec["corpus"] == "c"
    assert rec["warnings"] == ["noisy"] and rec["env"]["device"] == "cpu"
    assert "torch_threads" in rec["env"] and "timestamp" in rec["env"]


def test_a_failure_names_its_stage_and_keeps_what_the_body_added():
    def body(spec: Job, run: Run) -> dict:
        run.fields["corpus"] = "loaded"
        run.stage.now = "warming up"
        raise RuntimeError("boom")

    rec = measured("demo", Job(), body, first_stage="loading")
    assert rec["status"] == "error" and rec["message"] == "RuntimeError while warming up: boom"
    assert rec["corpus"] == "loaded" and "traceback" in rec and rec["metrics"] is None


def test_an_lmperf_error_before_any_stage_names_the_first_stage_without_a_traceback():
    def body(spec: Job, run: Run) -> dict:
        raise SpecError("bad data")

    rec = measured("demo", Job(), body, first_stage="loading the data")
    assert rec["message"] == "SpecError while loading the data: bad data"
    assert "traceback" not in rec


@pytest.mark.parametrize("precision, unsupported, why", [
    ("tf32", None, "TF32"),  # a regime this device cannot run
    ("fp32", lambda device: f"not on {device.type}", "not on cpu"),  # the kind's own check
])
def test_unsupported_runs_no_body(precision, unsupported, why):
    ran = []
    rec = measured("demo", Job(), lambda spec, run: ran.append(1) or {}, precision=precision,
                   unsupported=unsupported, fields={"metrics": {"analytic": 1}})
    assert rec["status"] == "unsupported" and why in rec["message"] and not ran
    assert rec["metrics"] == {"analytic": 1}


def test_the_regime_is_resolved_and_held_during_the_body():
    seen = {}

    def body(spec: Job, run: Run) -> dict:
        seen["regime"] = run.regime.name
        return {}

    assert measured("demo", Job(), body, precision="bf16-mixed")["status"] == "ok"
    assert seen == {"regime": "bf16-mixed"}


@pytest.mark.parametrize("precision, raises, status", [
    ("fp32", False, "ok"), ("fp32", True, "error"), ("tf32", False, "unsupported"),
])
def test_record_spec_is_every_record_s_identity(precision, raises, status):
    # profile's records carry the backend beside the run's spec, whatever the outcome
    def body(spec: Job, run: Run) -> dict:
        if raises:
            raise RuntimeError("boom")
        return {}

    rec = measured("demo", Job(), body, precision=precision,
                   record_spec={"device": "cpu", "backend": "torch"})
    assert rec["status"] == status and rec["spec"] == {"device": "cpu", "backend": "torch"}
