"""estimate.op_costs: FLOPs, bytes and issue order per aten op and phase, on fake tensors."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from lmperf.estimate import op_costs as oc
from lmperf.measure.flops import analytic_flops
from lmperf.workload.spec import RunSpec


def _rows(fn):
    with FakeTensorMode():
        with FlopCounterMode(display=False, custom_mapping=oc._custom_flops()) as flops, \
                oc._CostMode(flops) as mode:
            fn()
    return dict(mode.rows), dict(mode.order)


def test_a_matmul_reads_its_operands_and_writes_its_result():
    def fn():
        a, b = torch.empty(8, 16), torch.empty(16, 32)  # (M, K), (K, N)
        torch.mm(a, b)
    rows, order = _rows(fn)
    (key, (calls, flops, read, written)), = [(k, v) for k, v in rows.items() if k[1] == "aten::mm"]
    assert (calls, flops) == (1, 2 * 8 * 16 * 32)
    assert read == (8 * 16 + 16 * 32) * 4 and written == 8 * 32 * 4
    assert key == ("forward", "aten::mm", "fp32", read + written)  # sizes apart by bytes per call
    assert order["forward"][-1] == key


def test_calls_of_other_sizes_are_rows_of_their_own_and_the_order_is_kept():
    def fn():
        torch.exp(torch.empty(10))
        torch.exp(torch.empty(20))
        torch.exp(torch.empty(20))
    rows, order = _rows(fn)
    exp = {k[3]: v for k, v in rows.items() if k[1] == "aten::exp"}  # bytes per call -> values
    assert exp == {80: [1, 0, 40, 40], 160: [2, 0, 160, 160]}
    assert [k[3] for k in order["forward"] if k[1] == "aten::exp"] == [80, 160, 160]


def test_in_place_ops_write_their_operand_and_views_move_nothing():
    def fn():
        x, y = torch.empty(100), torch.empty(100)
        x.add_(y)  # reads x and y, writes x
        x.view(10, 10).t()
        torch.empty(1, 100).expand(50, 100).clone()  # a broadcast read counts its storage
    rows = {k[1]: v for k, v in _rows(fn)[0].items()}
    assert rows["aten::add_"][2:4] == [800, 400]
    assert rows["aten::view"][2:4] == [0, 0] and rows["aten::t"][2:4] == [0, 0]
    assert rows["aten::clone"][2:4] == [400, 50 * 100 * 4]


def test_op_classes_and_cuda_names():
    assert oc.op_class("aten::mm", "backward") == "matmul"
    assert oc.op_class("aten::_scaled_dot_product_flash_attention_for_cpu", "forward") == "attention"
    assert oc.op_class("aten::mul", "forward") == "elementwise/norm"
    assert oc.op_class("aten::mm", "optimizer") == "optimizer"
    cpu = "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert oc.cuda_op_name(cpu, "bf16") == "aten::_scaled_dot_product_flash_attention"
    assert oc.cuda_op_name(cpu + "_backward", "fp16") == (
        "aten::_scaled_dot_product_flash_attention_backward")
    assert oc.cuda_op_name(cpu, "fp32") == "aten::_scaled_dot_product_efficient_attention"
    assert oc.cuda_op_name("aten::mm", "bf16") == "aten::mm"


def test_a_fused_attention_counts_what_the_naive_products_compute():
    # torch's counter gives the CPU's flash attention 0 FLOPs (issue 26, D3)
    b, h, t, d = 2, 3, 16, 8

    def fused():
        q = torch.empty(b, h, t, d, requires_grad=True)
        o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        o.sum().backward()

    def naive():
        q = torch.empty(b, h, t, d, requires_grad=True)
        s = (q @ q.transpose(-2, -1)).softmax(-1)  # (B, H, T, T)
        (s @ q).sum().backward()

    def flops(fn, name):
        return sum(v[1] for k, v in _rows(fn)[0].items() if name(k[1]))
    forward = 2 * 2 * b * h * t * t * d  # Q K^T and P V, 2 FLOPs per multiply-add
    assert flops(fused, lambda n: "attention" in n and "backward" not in n) == forward
    assert flops(fused, lambda n: "attention_for_cpu_backward" in n) == 2 * forward
    assert flops(naive, lambda n: True) == flops(fused, lambda n: True) == 3 * forward


@pytest.mark.slow
def test_counts_match_the_analytic_flops_and_extrapolation_is_exact():
    spec = RunSpec.from_size("tiny", num_layers=3, context=32, batch=2,
                             optimizer="fused")
    costs = oc.count_op_costs(spec)
    assert "extrapolated linearly to 3" in costs.method
    rows, order, tensors = oc._count(spec, None)
    assert costs.param_tensors == tensors == 3 * 9 + 3  # per block 9, embedding, norm, head
    counted = {k: v for k, v in rows.items() if k[0] != "after" and any(v)}
    table = {(r.phase, r.op, r.dtype, 0 if r.phase == "optimizer" or not r.calls
              else (r.bytes_read + r.bytes_written) // r.calls):
             [getattr(r, c) for c in oc.VALUES] for r in costs.table.itertuples()}
    assert table == counted
    # the issue order of 3 layers from those of 1 and 2 is the order a whole count sees
    keys = list(counted)
    for phase in ("forward", "backward", "optimizer"):
        assert costs.order[phase] == [keys.index(k) for k in order[phase]]
    expected = analytic_flops(spec.d_model, 3, spec.d_ff, spec.vocab_size, 2, 32, "train-step")
    assert costs.table["flops"].sum() == expected.total
    phases = costs.table.groupby("phase")[["calls", "flops", "bytes_read", "bytes_written"]].sum()
    assert phases.loc["backward", "flops"] == 2 * phases.loc["forward", "flops"]
    assert phases.loc["optimizer", "flops"] == 0 and phases.loc["optimizer", "bytes_written"] > 0
    # AdamW's state is made in the uncounted first step: no zeros_like in the counted one
    assert not ((costs.table["phase"] == "optimizer") & (costs.table["op"] == "aten::zeros_like")).any()


def test_repeat_inserts_the_block_the_second_layer_added():
    one, two = list("PabS"), list("PababS")
    assert oc._repeat(one, two, 4) == list("PababababS")
    assert oc._repeat(list("ab"), list("ba"), 3) is None  # not one inserted block


@pytest.mark.slow
def test_bf16_mixed_counts_its_matmuls_in_bf16_and_cuda_runs_its_fp32_list_in_fp32():
    spec = RunSpec.from_size("tiny", context=16, batch=1, precision="bf16-mixed",
                             mode="forward", num_layers=1)
    cpu = oc.count_op_costs(spec).table
    mm = cpu[cpu["op"] == "aten::mm"]
    assert set(mm["dtype"]) == {"bf16"} and set(cpu["phase"]) == {"forward"}
    cuda = oc.count_op_costs(replace(spec, device="cuda")).table
    dtypes = {d: set(t.loc[t["op"] == "aten::rsqrt", "dtype"]) for d, t in (("cpu", cpu),
                                                                            ("cuda", cuda))}
    # the RMSNorm's rsqrt: CUDA's autocast runs it in fp32 (issue 26, L1), the CPU's in bf16
    assert dtypes["cuda"] == {"fp32"}
    assert set(cuda.loc[cuda["op"] == "aten::mm", "dtype"]) == {"bf16"}


@pytest.mark.slow
def test_gradient_clipping_is_counted_as_real_runs_do_it_foreach():
    # fake tensors would take clip_grad_norm_'s per-tensor path (one norm and one mul per
    # parameter); real CPU and CUDA tensors take foreach's few calls whatever the depth
    costs = [oc.count_op_costs(RunSpec.from_size("tiny", num_layers=n, context=16, batch=1,
                                                 optimizer="fused")) for n in (1, 3)]
    calls = [c.table.loc[c.table["phase"] == "optimizer", "calls"].sum() for c in costs]
    assert calls[0] == calls[1] < 20
    table = costs[1].table[costs[1].table["phase"] == "optimizer"].groupby("op")["calls"].sum()
    assert table["aten::_foreach_norm"] == 1 and table["aten::linalg_vector_norm"] == 1  # total
    assert "optimizer" in costs[1].order  # the same calls at every depth: the order is kept
    from torch.utils import _foreach_utils
    assert all(t.__name__ != "FakeTensor" for t in _foreach_utils._foreach_supported_types)
