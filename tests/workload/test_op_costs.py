"""workload.op_costs: FLOPs and bytes per aten op and phase, counted on fake tensors."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from lmperf.workload import op_costs as oc
from lmperf.measure.flops import analytic_flops
from lmperf.workload.spec import RunSpec


def _rows(fn):
    with FakeTensorMode():
        with FlopCounterMode(display=False) as flops, oc._CostMode(flops) as mode:
            fn()
    return dict(mode.rows)


def test_a_matmul_reads_its_operands_and_writes_its_result():
    def fn():
        a, b = torch.empty(8, 16), torch.empty(16, 32)  # (M, K), (K, N)
        torch.mm(a, b)
    (key, (calls, flops, read, written, elements, faults)), = [
        (k, v) for k, v in _rows(fn).items() if k[1] == "aten::mm"]
    assert (calls, flops) == (1, 2 * 8 * 16 * 32)
    assert read == (8 * 16 + 16 * 32) * 4 and written == 8 * 32 * 4
    assert key[3:6] == (8, 16, 32) and elements == 8 * 32  # (m, k, n); the output's elements
    assert faults == 0  # page faults are charged by _count's replay of the whole step


def test_batched_products_and_sizes_are_rows_of_their_own():
    def fn():
        a, b = torch.empty(3, 8, 16), torch.empty(3, 16, 4)  # (B, M, K), (B, K, N)
        torch.bmm(a, b)
        torch.addmm(torch.empty(4), torch.empty(8, 16), torch.empty(16, 4))  # bias, (M, K), (K, N)
        torch.exp(torch.empty(10))
        torch.exp(torch.empty(20))
        torch.exp(torch.empty(20))
    rows = _rows(fn)
    assert [k[3:6] for k in rows if k[1] == "aten::bmm"] == [(8, 16, 4)]
    assert [k[3:6] for k in rows if k[1] == "aten::addmm"] == [(8, 16, 4)]
    exp = {k[6]: v for k, v in rows.items() if k[1] == "aten::exp"}  # bytes per call -> values
    assert exp == {80: [1, 0, 40, 40, 10, 0], 160: [2, 0, 160, 160, 40, 0]}
    assert all(k[3:6] == (0, 0, 0) for k in rows if k[1] == "aten::exp")


def test_in_place_ops_write_their_operand_and_views_move_nothing():
    def fn():
        x, y = torch.empty(100), torch.empty(100)
        x.add_(y)  # reads x and y, writes x
        x.view(10, 10).t()
        torch.empty(1, 100).expand(50, 100).clone()  # a broadcast read counts its storage
    rows = {k[1]: v for k, v in _rows(fn).items()}
    assert rows["aten::add_"][2:4] == [800, 400]
    assert rows["aten::view"][2:4] == [0, 0] and rows["aten::t"][2:4] == [0, 0]
    assert rows["aten::clone"][2:4] == [400, 50 * 100 * 4]


def test_op_classes():
    assert oc.op_class("aten::mm", "backward") == "matmul"
    assert oc.op_class("aten::_scaled_dot_product_flash_attention_for_cpu", "forward") == "attention"
    assert oc.op_class("aten::mul", "forward") == "elementwise/norm"
    assert oc.op_class("aten::mm", "optimizer") == "optimizer"


@pytest.mark.slow
def test_counts_match_the_analytic_flops_and_extrapolation_is_exact():
    spec = RunSpec.from_size("tiny", num_layers=3, context=32, batch=2,
                             optimizer="fused")
    costs = oc.count_op_costs(spec)
    assert "extrapolated linearly to 3" in costs.method
    whole, tensors = oc._count(spec, None)[:2]
    assert costs.param_tensors == tensors == 3 * 9 + 3  # per block 9, embedding, norm, head
    # the table's rows (size key: bytes per call, optimizer rows 0) against a whole count; page
    # faults are the 2-layer step's, not extrapolated (see op_costs): left out here
    linear = [c for c in oc.VALUES if c != "fault_bytes"]
    counted = {k: v[:len(linear)] for k, v in whole.items() if k[0] != "after"}
    rows = {(r.phase, r.op, r.dtype, r.m, r.k, r.n, 0 if r.phase == "optimizer" or not r.calls
             else (r.bytes_read + r.bytes_written) // r.calls):
            [getattr(r, c) for c in linear] for r in costs.table.itertuples()}
    assert rows == {k: v for k, v in counted.items() if any(v)} | {
        k: v for k, v in rows.items() if not any(v)}
    expected = analytic_flops(spec.d_model, 3, spec.d_ff, spec.vocab_size, 2, 32, "train-step")
    assert costs.table["flops"].sum() == expected.total
    phases = costs.by_phase().set_index("phase")
    assert phases.loc["backward", "flops"] == 2 * phases.loc["forward", "flops"]
    assert phases.loc["optimizer", "flops"] == 0 and phases.loc["optimizer", "bytes_written"] > 0
    # AdamW's state is made in the uncounted first step: no zeros_like in the counted one
    assert not ((costs.table["phase"] == "optimizer") & (costs.table["op"] == "aten::zeros_like")).any()


@pytest.mark.slow
def test_bf16_mixed_counts_its_matmuls_in_bf16():
    spec = RunSpec.from_size("tiny", context=16, batch=1, precision="bf16-mixed",
                             mode="forward")
    table = oc.count_op_costs(spec).table
    mm = table[table["op"] == "aten::mm"]
    assert set(mm["dtype"]) == {"bf16"} and set(table["phase"]) == {"forward"}


@pytest.mark.slow
def test_the_step_replay_charges_page_faults_to_the_outputs_that_take_fresh_memory():
    # tiny at context 128 writes 20 MB logits (B T x V fp32): the largest block the step
    # frees, so glibc's mmap threshold rises to it and they come from the heap, whose top is
    # trimmed when the backward frees two of them (2 x 20 MB >= the trim threshold 2 T): the
    # next step faults them in again (measured: ~10,000 faulted pages per phase, ru_minflt)
    spec = RunSpec.from_size("tiny", context=128, batch=4, optimizer="fused")
    costs = oc.count_op_costs(spec)
    table = costs.table
    faults = table[table["fault_bytes"] > 0].groupby(["phase", "op"])["fault_bytes"].sum()
    logits = 4 * 128 * spec.vocab_size * 4
    assert faults[("forward", "aten::_log_softmax")] >= logits
    assert faults[("backward", "aten::_log_softmax_backward_data")] >= logits
    assert faults.sum() < 6 * logits  # small activations are reused from the heap's holes
    assert 0 < sum(costs.returned_bytes.values()) <= faults.sum()  # trims give them back


def test_page_faults_are_left_out_and_said_so_where_the_c_library_is_not_glibc(monkeypatch):
    from lmperf.workload import heap_faults as hf

    spec = RunSpec.from_size("tiny", context=16, batch=1, mode="forward", num_layers=1)
    # tiny's logits (16 x 10000 fp32 = 640 KB) are the largest block: glibc maps them fresh
    glibc = oc.count_op_costs(spec)
    assert glibc.table["fault_bytes"].sum() > 0 and "glibc" in glibc.fault_method
    monkeypatch.setattr(hf, "glibc_version", lambda: None)  # musl, macOS
    other = oc.count_op_costs(spec)
    assert other.table["fault_bytes"].sum() == 0 and other.returned_bytes == {}
    assert "not glibc" in other.fault_method
    assert other.table["flops"].sum() == glibc.table["flops"].sum()  # the rest is counted alike


def test_glibc_version_reads_the_running_library(monkeypatch):
    from lmperf.workload import heap_faults as hf

    monkeypatch.setattr(hf.os, "confstr", lambda name: "glibc 2.36")
    assert hf.glibc_version() == "2.36"

    def unknown(name):
        raise ValueError("unrecognized configuration name")

    monkeypatch.setattr(hf.os, "confstr", unknown)  # musl: no such name
    monkeypatch.setattr(hf.platform, "libc_ver", lambda: ("", ""))
    assert hf.glibc_version() is None


def test_an_output_without_storage_is_counted_but_left_out_of_the_heap_replay():
    # a sparse gradient (nn.Embedding(sparse=True) in a user's model) has no storage to watch
    with FakeTensorMode():
        with FlopCounterMode(display=False) as flops, oc._CostMode(flops) as mode:
            dense = torch.ones(4, 4)
            sparse = dense.to_sparse()
    assert sparse.is_sparse
    assert any(key[1] == "aten::_to_sparse" for key in mode.rows)
    assert [n for _, n, _ in mode.events if n >= 0] == [64]  # the dense ones only
