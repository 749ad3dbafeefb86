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


def test_a_search_where_nothing_launched_caches_nothing_and_the_default_runs():
    # Before: `min` of all-inf times picked the first candidate and cached it as chosen.
    default, tried = T(64, 64, 4, 2), []
    key, kept = ("dq", 1, 1, 1, 64, "bfloat16", True), [T(128, 64, 8, 2), T(64, 32, 4, 2)]
    with fc.searching() as found:
        for _ in range(2):  # a second call in the block does not search again
            assert fc.choose(key, default, lambda c: tried.append(c) or math.inf,
                             lambda: kept) == default
    assert not fc.CHOSEN and tried == kept and len(found) == 1
    assert found[0]["chosen"] is None and set(found[0]["candidates_ms"].values()) == {None}
    json.dumps(found[0], allow_nan=False)
    with fc.searching():  # a later block tries again
        assert fc.choose(key, default, lambda c: 1.0, lambda: kept) == kept[0] == fc.CHOSEN[key]


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
    from lmperf.kernels import interpreter_gap

    if (gap := interpreter_gap()):
        pytest.skip(gap)
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


# --- the CUDA search path of flash_triton._launch, with the launch and the timer faked -----------

class _FakeCuda:
    """flash_triton's CUDA path on this CPU: kernels that record each launch's configuration and
    raise `fail(cfg)` if it is an exception; a timer that makes its calls and gives `ms(cfg)` of
    the last launch (or raises `timer_error`); Triton's device properties with sm_90's limit."""

    def __init__(self, monkeypatch, ms=lambda cfg: 1.0, fail=lambda cfg: None, timer_error=None):
        triton = pytest.importorskip("triton")
        from types import SimpleNamespace

        from lmperf.kernels import flash_triton as ft
        from lmperf.runtime import device as dev

        self.ms, self.fail, self.timer_error, self.launched = ms, fail, timer_error, []
        monkeypatch.setattr(ft, "_interpreting", lambda q: False)
        monkeypatch.setattr(ft, "_kernels", lambda interpret: dict.fromkeys(
            ("fwd", "delta", "dq", "dkdv"), self))
        props = SimpleNamespace(get_device_properties=lambda index: {"max_shared_mem": 227 << 10})
        monkeypatch.setattr(triton.runtime.driver, "_active", SimpleNamespace(utils=props))
        monkeypatch.setattr(dev, "cuda_index", lambda device: 0)
        monkeypatch.setattr(dev, "time_cuda_calls", self.time)
        self.launch_fwd = lambda dtype=BF16: ft._launch(
            "fwd", lambda cfg: (1, 1, 1), (), torch.empty(1, 2, 1030, 64, dtype=dtype), 1030, True,
            (None, None), IS_CAUSAL=True)

    def __getitem__(self, grid):
        return self.run

    def run(self, **kw):
        cfg = T(kw["BLOCK_Q"], kw["BLOCK_K"], kw["num_warps"], kw["num_stages"])
        self.launched.append(cfg)
        if self.fail(cfg):
            raise self.fail(cfg)

    def time(self, fn, device, warmup, repeats):
        fn()
        if self.timer_error:
            raise self.timer_error
        return [self.ms(self.launched[-1])] * repeats


def test_the_cuda_path_searches_inside_searching_times_the_shortlist_and_runs_the_winner(
        monkeypatch):
    kept = fc.candidates("fwd", BF16, 64, 227 << 10)  # what the shortlist must be on sm_90
    win = [c for c in kept if c.num_stages == 3][-1]  # in its shape's second round
    gpu = _FakeCuda(monkeypatch, ms=lambda c: {win: 0.5, dataclasses.replace(win, num_stages=2):
                                                 0.8}.get(c, 2.0))
    default = fc.default_config("fwd", BF16, 64)
    gpu.launch_fwd()  # outside searching(): the default, once, nothing searched
    assert gpu.launched == [default] and not fc.CHOSEN and not fc.SEARCHES
    with fc.searching() as found:
        gpu.launch_fwd()
        gpu.launch_fwd()  # searched once per key
        gpu.launch_fwd(F32)  # fp32 keeps its default: no search
    key = fc.search_key("fwd", 2, 1030, 1030, 64, BF16, True)
    assert fc.CHOSEN == {key: win} and len(found) == 1 and found == fc.SEARCHES
    tried = gpu.launched[1:-3]  # one launch in each trial: the timer's
    assert set(tried) <= set(kept) and win in tried and len(set(tried)) == len(tried)
    assert {(c.block_q, c.block_k, c.num_warps) for c in tried} == {
        (c.block_q, c.block_k, c.num_warps) for c in kept}  # every shape and warp count
    assert gpu.launched[-3:] == [win, win, fc.default_config("fwd", F32, 64)]
    assert found[0]["chosen"] == win.label() and found[0]["candidates_ms"][win.label()] == 0.5


def test_the_cuda_path_caches_nothing_when_no_candidate_launched(monkeypatch):
    # Out of memory in every trial (the timer's L2 flush buffer in a full device): the default
    # runs and is not cached. Before: the first candidate was cached and run, recorded "no launch".
    gpu = _FakeCuda(monkeypatch, timer_error=torch.cuda.OutOfMemoryError("CUDA out of memory."))
    with fc.searching() as found:
        gpu.launch_fwd()
    assert not fc.CHOSEN and found[0]["chosen"] is None
    assert set(found[0]["candidates_ms"].values()) == {None}
    assert gpu.launched[-1] == fc.default_config("fwd", BF16, 64)


def test_the_cuda_path_skips_out_of_resources_and_raises_anything_else(monkeypatch):
    from triton.runtime import OutOfResources

    kept = fc.candidates("fwd", BF16, 64, 227 << 10)
    gpu = _FakeCuda(monkeypatch, fail=lambda c: c == kept[0] and OutOfResources(1, 0, "shared"))
    with fc.searching() as found:
        gpu.launch_fwd()
    assert found[0]["candidates_ms"][kept[0].label()] is None and kept[0] not in fc.CHOSEN.values()
    fc.CHOSEN.clear()
    # A kernel that fails otherwise (a bug in one configuration) fails the call, not the search's
    # candidate. Before: scored inf and skipped, so another candidate ran silently.
    bad = [c for c in kept if c.num_stages == 2][1]  # another shape: tried in the first round
    gpu.fail = lambda c: c == bad and RuntimeError("CUDA error: an illegal memory access")
    with pytest.raises(RuntimeError, match="illegal memory access"), fc.searching():
        gpu.launch_fwd()
    assert not fc.CHOSEN
