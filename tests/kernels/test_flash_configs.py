"""flash-triton's launch configurations: the space and its pruning rule, the cached search (only
inside `searching()`, once per key), and the jobs that search in their warm-up and record it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math

import pytest
import torch

from lmperf.kernels import flash_configs as fc
from lmperf.kernels.flash_configs import TileConfig as T

BF16, F32 = torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.setattr(fc, "CHOSEN", {})
    monkeypatch.setattr(fc, "SEARCHES", [])


def test_lengths_are_rounded_up_to_a_power_of_two():
    keys = [fc.search_key("fwd", n, n, n, 64, BF16, True) for n in (1, 2, 3, 512, 513, 16384)]
    assert [key[1:4] for key in keys] == [(n, n, n) for n in (1, 2, 4, 512, 1024, 16384)]


def test_lengths_in_one_bucket_share_a_key_and_the_rest_tells_keys_apart():
    key = fc.search_key("fwd", 1, 1000, 1000, 64, BF16, True)
    assert key == fc.search_key("fwd", 1, 1024, 1024, 64, BF16, True)
    others = [fc.search_key("fwd", 1, 1025, 1000, 64, BF16, True),
              fc.search_key("fwd", 1, 1000, 1025, 64, BF16, True),
              fc.search_key("fwd", 3, 1000, 1000, 64, BF16, True),
              fc.search_key("dq", 1, 1000, 1000, 64, BF16, True),
              fc.search_key("fwd", 1, 1000, 1000, 80, BF16, True),
              fc.search_key("fwd", 1, 1000, 1000, 64, torch.float16, True),
              fc.search_key("fwd", 1, 1000, 1000, 64, BF16, False)]
    assert len({key, *others}) == 8


def test_the_search_runs_only_inside_searching_and_once_per_key():
    tried = []

    def trial(cfg):
        tried.append(cfg)
        return {64: 2.0, 128: 1.0}[cfg.block_q]

    default, fast = T(64, 64, 4, 2), T(128, 64, 4, 3)
    key = fc.search_key("fwd", 1, 4096, 4096, 64, BF16, True)
    args = (key, default, trial, lambda: [default, fast])
    assert fc.choose(*args) == default and tried == []  # outside the block: no search
    with fc.searching() as found:
        assert fc.choose(*args) == fast
        assert fc.choose(*args) == fast  # the key is cached: no second search
    assert fc.choose(*args) == fast and tried == [default, fast]  # after it: still cached
    (row,) = found
    assert row["kernel"] == "fwd" and row["chosen"] == "128x64 w4 s3"
    assert row["key"] == {"rows": 1, "n_q": 4096, "n_k": 4096, "d": 64, "dtype": "bfloat16",
                          "causal": True}
    assert row["candidates_ms"] == {"64x64 w4 s2": 2.0, "128x64 w4 s3": 1.0}
    assert row["search_s"] >= 0 and fc.SEARCHES == found
    json.dumps(row, allow_nan=False)  # goes into a record as it is


def test_a_candidate_that_cannot_launch_is_never_chosen_and_recorded_as_none():
    default, big = T(64, 64, 4, 2), T(128, 128, 8, 4)
    with fc.searching() as found:
        chosen = fc.choose(("fwd", 1, 1, 1, 64, "bfloat16", True), default,
                           lambda cfg: math.inf if cfg is big else 3.0, lambda: [big, default])
    assert chosen == default
    assert found[0]["candidates_ms"] == {big.label(): None, default.label(): 3.0}


@pytest.mark.parametrize("kernel", fc.KERNELS)
def test_the_pruning_rule_keeps_what_fits_and_drops_what_cannot(kernel, monkeypatch):
    limits = (99 * 1024, 163 * 1024, 227 * 1024)  # per program on sm_86/89, sm_80, sm_90
    for dtype in (BF16, torch.float16):
        for block_d in (64, 128):
            kept = [fc.candidates(kernel, dtype, block_d, limit) for limit in limits]
            assert kept[0] and all(set(a) <= set(b) for a, b in zip(kept, kept[1:]))
            assert len(kept[-1]) < len(fc.SPACE)  # something is pruned
            # one warp count per tile shape: the fewest that fit
            shapes = [(c.block_q, c.block_k) for c in kept[-1] if c.num_stages == 2]
            assert len(shapes) == len(set(shapes))
    # 128 x 128 tiles at d = 128 hold two fp32 tiles of 16,384 values: too many registers
    assert not [c for c in fc.candidates(kernel, BF16, 128, limits[-1])
                if c.block_q == c.block_k == 128]
    # the register budget is what prunes them: without it, 8 warps of them fit sm_90
    monkeypatch.setattr(fc, "MAX_VALUES_PER_THREAD", 10**6)
    assert [c for c in fc.candidates(kernel, BF16, 128, limits[-1])
            if c.block_q == c.block_k == 128]


def test_the_shared_memory_rule_follows_the_stages(monkeypatch):
    # fwd 128 x 128 at d = 128 in bf16: 2 stages of K and V tiles (128 KiB), Q and one score tile
    # (64 KiB): 192 KiB fits sm_90 (227 KiB), not sm_80 (163 KiB); a third stage fits neither.
    def kept(limit):
        return {c.num_stages for c in fc.candidates("fwd", BF16, 128, limit)
                if c.block_q == c.block_k == 128}

    monkeypatch.setattr(fc, "MAX_VALUES_PER_THREAD", 10**6)
    assert kept(227 * 1024) == {2} and kept(163 * 1024) == set()


def test_the_search_tries_every_shape_then_the_winners_stage_counts():
    kept = [T(64, 64, 4, 2), T(64, 64, 4, 3), T(128, 64, 8, 2), T(128, 64, 8, 3),
            T(128, 64, 8, 4)]
    tried = []

    def trial(cfg):
        tried.append(cfg)
        return {T(128, 64, 8, 2): 0.8, T(128, 64, 8, 3): 0.5, T(64, 64, 4, 2): 1.0}.get(cfg, 2.0)

    with fc.searching() as found:
        chosen = fc.choose(("dq", 1, 1, 1, 64, "bfloat16", True), kept[0], trial, lambda: kept)
    assert tried == [kept[0], kept[2], kept[3], kept[4]]  # 64 x 64 w4 s3 lost in round 1
    assert chosen == T(128, 64, 8, 3) and found[0]["chosen"] == "128x64 w8 s3"


def _fake_searching(rows):
    entered = []

    @contextlib.contextmanager
    def searching():
        entered.append(True)
        yield list(rows)

    return searching, entered


def test_the_attention_job_searches_in_one_untimed_call_and_records_it(monkeypatch):
    from lmperf.questions.attention.job import run_spec
    from lmperf.questions.attention.spec import AttnSpec

    pytest.importorskip("triton")
    row = {"kernel": "fwd", "chosen": "128x64 w4 s3"}
    searching, entered = _fake_searching([row])
    monkeypatch.setattr(fc, "searching", searching)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = AttnSpec("flash-triton", context=32, d=16, warmup=1, steps=1)
    r = run_spec(spec)
    assert r["status"] == "ok", r["message"]
    assert entered == [True] and r["metrics"]["autotune"] == [row]
    r = run_spec(dataclasses.replace(spec, warmup=0))  # no warm-up asked for: no search
    assert entered == [True] and "autotune" not in r["metrics"]
    assert "autotune" not in run_spec(AttnSpec("naive", context=32, d=16, steps=1))["metrics"]


def test_the_bench_job_searches_in_its_warm_up_steps_and_records_it(monkeypatch):
    from lmperf.questions.bench.job import run_spec
    from lmperf.workload.spec import RunSpec

    row = {"kernel": "dq", "chosen": "64x32 w4 s2"}
    searching, entered = _fake_searching([row])
    monkeypatch.setattr(fc, "searching", searching)
    r = run_spec(RunSpec.from_size("tiny", context=16, batch=2, warmup=1, steps=1))
    assert r["status"] == "ok", r["message"]
    assert entered == [True] and r["metrics"]["autotune"] == [row]
    monkeypatch.setattr(fc, "searching", _fake_searching([])[0])
    r = run_spec(RunSpec.from_size("tiny", context=16, batch=2, warmup=1, steps=1))
    assert "autotune" not in r["metrics"]  # nothing searched: no field
