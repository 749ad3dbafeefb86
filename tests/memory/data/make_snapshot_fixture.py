"""Write `snapshot_small.pickle`: a small CUDA memory snapshot in the format torch writes.

No GPU was available when this fixture was made, so the snapshot is built by hand, following
torch's own code for its structure (replace it with a real snapshot from a GPU when one is
available; the lead records that in docs/gpu-validation.md):

- torch/cuda/memory.py, `_snapshot` docstring (the Snapshot / Segment / Block / Frame /
  TraceEntry TypedDicts) and `_dump_snapshot` (`pickle.dump(_snapshot(), f)`);
- torch/csrc/cuda/Module.cpp, `THCPModule_memorySnapshot` (the dict actually built: segment keys
  device, address, total_size, allocated_size, active_size, requested_size, stream,
  segment_type, segment_pool_id, is_expandable, frames, blocks; block keys address, size,
  requested_size, state in {active_allocated, active_pending_free, inactive}, frames; trace keys
  action, addr (device_free for 'oom'), size, stream, time_us, frames; top-level keys segments,
  device_traces, allocator_settings, external_annotations);
- c10/cuda/CUDACachingAllocator.cpp: an 'alloc' entry carries the requested size, and
  free_requested / free_completed carry the block's requested_size; a segment_alloc (cudaMalloc)
  is recorded inside the malloc that needed it, just before that malloc's 'alloc';
- frames are leaf first (innermost call first), as symbolised by CapturedTraceback; this
  fixture is what `stacks="all"` records: C++ frames (filename '??' or a .cpp path) before the
  Python ones, and none but C++ frames for allocations made on the autograd engine thread.

The story (device 0, sizes in MiB, M = 2**20 bytes; two tensors were allocated before recording
started: P, 8 M parameters, live to the end, and Q, 4 M, freed during the trace):

    event action          tensor            active after (M)   reserved after (M)
    start                                   12 (= P 8 + Q 4)   20 (segment S1)
      0   alloc           A1 ffn act 6      18                 20
      1   segment_alloc   S2 32             18                 52
      2   alloc           A2 scores 24      42                 52
      3   alloc           A3 logits 3       45  <- peak        52
      4   free_requested  A2                45                 52
      5   free_completed  A2                21                 52
      6   alloc           G1 grad 8         29                 52
      7   free_requested  Q                 29                 52
      8   free_completed  Q                 25                 52
      9   segment_alloc   S3 2 (small)      25                 54
     10   alloc           L loss 4 bytes    25 + 4 B           54
     11   free_requested  A1                25 + 4 B           54
     12   free_completed  A1                19 + 4 B           54
     13   free_requested  A3                19 + 4 B           54
     14   free_completed  A3                16 + 4 B           54
     15   alloc           G2 grad 10        26 + 4 B           54
     16   free_requested  L                 26 + 4 B           54
     17   free_completed  L                 26                 54
     18   segment_free    S3                26                 52
     19   oom             40 requested, 12 free on the device

At the dump: S1 (20 M) holds P (active_allocated, no frames: allocated before recording) and one
12 M inactive block; S2 (32 M) holds G1 at +0, G2 at +8 M and a 14 M inactive block.
Reserved 52 M, allocated 26 M. Largest allocation: A2, 24 M, allocated by
NaiveAttention.scores (attention.py:37) under __call__ (attention.py:52) under
CausalSelfAttention.forward (transformer.py:117).

Run `python tests/memory/data/make_snapshot_fixture.py` to rewrite the pickle; the test suite
checks that the committed file is what this script writes.
"""

from __future__ import annotations

import pickle
from pathlib import Path

M = 2**20
OUT = Path(__file__).with_name("snapshot_small.pickle")
# torch's _dump_snapshot uses the interpreter's default protocol (4 on Python 3.8-3.13, 5 on
# 3.14); pinned here so that the committed bytes do not depend on the Python that rewrites them.
PROTOCOL = 4

S1, S2, S3 = 0x7F3A_4000_0000, 0x7F3A_4200_0000, 0x7F3A_4600_0000  # segment addresses
T0 = 1_763_700_000_000_000  # time_us of the first event (microseconds since the epoch)

TORCH = "/opt/conda/lib/python3.11/site-packages/torch"
REPO = "/work/main/src/lmperf"


def frame(name: str, filename: str, line: int) -> dict:
    """One stack frame, keys in the order torch's symboliser inserts them."""
    return {"name": name, "filename": filename, "line": line}


CPP_MALLOC = frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc("
                   "signed char, unsigned long, CUstream_st*)", "??", 0)
CPP_ENGINE = [frame("torch::autograd::Engine::evaluate_function(...)",
                    "/pytorch/torch/csrc/autograd/engine.cpp", 1091),
              frame("torch::autograd::Engine::thread_main(...)",
                    "/pytorch/torch/csrc/autograd/engine.cpp", 614),
              frame("start_thread", "??", 0)]
MODULE_CALL = [frame("_call_impl", f"{TORCH}/nn/modules/module.py", 1784),
               frame("_wrapped_call_impl", f"{TORCH}/nn/modules/module.py", 1773)]
# The Python stack of a train step, from the model's forward up to the caller.
STEP = [*MODULE_CALL,
        frame("_run_blocks", f"{REPO}/model/transformer.py", 202),
        frame("forward", f"{REPO}/model/transformer.py", 214),
        *MODULE_CALL,
        frame("_loss", f"{REPO}/bench/steps.py", 68),
        frame("train_step", f"{REPO}/bench/steps.py", 99),
        frame("_record_steps", f"{REPO}/memory/snapshot.py", 180)]

STACKS: dict[str, list[dict]] = {
    "A1": [CPP_MALLOC,
           frame("at::native::addmm_out_cuda_impl(...)", "/pytorch/aten/src/ATen/native/cuda/Blas.cpp", 284),
           frame("torch::autograd::THPVariable_linear(...)",
                 "/pytorch/torch/csrc/autograd/generated/python_nn_functions.cpp", 2310),
           frame("forward", f"{REPO}/model/transformer.py", 34),
           *MODULE_CALL,
           frame("forward", f"{REPO}/model/transformer.py", 132),
           *MODULE_CALL,
           frame("forward", f"{REPO}/model/transformer.py", 148),
           *STEP],
    "A2": [CPP_MALLOC,
           frame("at::native::bmm_out_cuda(...)", "/pytorch/aten/src/ATen/native/cuda/Blas.cpp", 414),
           frame("at::native::einsum(...)", "/pytorch/aten/src/ATen/native/Linear.cpp", 573),
           frame("torch::autograd::THPVariable_einsum(...)",
                 "/pytorch/torch/csrc/autograd/generated/python_torch_functions_1.cpp", 5120),
           frame("einsum", f"{TORCH}/functional.py", 422),
           frame("scores", f"{REPO}/model/attention.py", 37),
           frame("__call__", f"{REPO}/model/attention.py", 52),
           frame("forward", f"{REPO}/model/transformer.py", 117),
           *MODULE_CALL,
           frame("forward", f"{REPO}/model/transformer.py", 147),
           *STEP],
    "A3": [CPP_MALLOC,
           frame("at::native::addmm_out_cuda_impl(...)", "/pytorch/aten/src/ATen/native/cuda/Blas.cpp", 284),
           frame("forward", f"{REPO}/model/transformer.py", 34),
           *MODULE_CALL,
           frame("forward", f"{REPO}/model/transformer.py", 224),
           *MODULE_CALL,
           frame("_loss", f"{REPO}/bench/steps.py", 68),
           frame("train_step", f"{REPO}/bench/steps.py", 99),
           frame("_record_steps", f"{REPO}/memory/snapshot.py", 180)],
    "L": [CPP_MALLOC,
          frame("cross_entropy", f"{TORCH}/nn/functional.py", 3462),
          frame("_loss", f"{REPO}/bench/steps.py", 70),
          frame("train_step", f"{REPO}/bench/steps.py", 99),
          frame("_record_steps", f"{REPO}/memory/snapshot.py", 180)],
    # backward runs on the autograd engine thread: no Python frames there
    "G1": [CPP_MALLOC, frame("at::native::mm_out_cuda(...)", "/pytorch/aten/src/ATen/native/cuda/Blas.cpp", 460),
           *CPP_ENGINE],
    "G2": [CPP_MALLOC, frame("at::native::mm_out_cuda(...)", "/pytorch/aten/src/ATen/native/cuda/Blas.cpp", 460),
           *CPP_ENGINE],
    "free_bwd": [frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(...)", "??", 0),
                 *CPP_ENGINE],
    "free_Q": [frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(...)", "??", 0),
               frame("zero_grad", f"{TORCH}/optim/optimizer.py", 1020),
               frame("train_step", f"{REPO}/bench/steps.py", 104),
               frame("_record_steps", f"{REPO}/memory/snapshot.py", 180)],
    "free_L": [frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(...)", "??", 0),
               frame("train_step", f"{REPO}/bench/steps.py", 99),
               frame("_record_steps", f"{REPO}/memory/snapshot.py", 180)],
}

# tensor -> (address, requested bytes)
TENSORS: dict[str, tuple[int, int]] = {
    "P": (S1, 8 * M), "Q": (S1 + 8 * M, 4 * M), "A1": (S1 + 12 * M, 6 * M),
    "A2": (S2, 24 * M), "A3": (S2 + 24 * M, 3 * M), "G1": (S2, 8 * M), "G2": (S2 + 8 * M, 10 * M),
    "L": (S3, 4),
}
SEGMENTS = {"S2": (S2, 32 * M, "A2"), "S3": (S3, 2 * M, "L")}  # addr, size, stack of the malloc


def trace_entry(i: int, action: str, addr: int, size: int, frames: list[dict]) -> dict:
    """One TraceEntry as THCPModule_memorySnapshot builds it (frames added last)."""
    return {"action": action, "addr": addr, "size": size, "stream": 0,
            "time_us": T0 + 150 * i, "frames": frames}


def device_trace() -> list[dict]:
    """The 20 events of the table in the module docstring."""
    steps: list[tuple[str, str, str]] = [  # (action, tensor or segment, stack)
        ("alloc", "A1", "A1"), ("segment_alloc", "S2", "A2"), ("alloc", "A2", "A2"),
        ("alloc", "A3", "A3"), ("free_requested", "A2", "free_bwd"),
        ("free_completed", "A2", "free_bwd"), ("alloc", "G1", "G1"),
        ("free_requested", "Q", "free_Q"), ("free_completed", "Q", "free_Q"),
        ("segment_alloc", "S3", "L"), ("alloc", "L", "L"),
        ("free_requested", "A1", "free_bwd"), ("free_completed", "A1", "free_bwd"),
        ("free_requested", "A3", "free_bwd"), ("free_completed", "A3", "free_bwd"),
        ("alloc", "G2", "G2"), ("free_requested", "L", "free_L"),
        ("free_completed", "L", "free_L"), ("segment_free", "S3", "free_L"),
    ]
    out = []
    for i, (action, what, stack) in enumerate(steps):
        addr, size = (SEGMENTS[what][:2] if action.startswith("segment") else TENSORS[what])
        out.append(trace_entry(i, action, addr, size, STACKS[stack]))
    # An OOM entry has device_free where the others have addr (Module.cpp).
    out.append({"action": "oom", "device_free": 12 * M, "size": 40 * M, "stream": 0,
                "time_us": T0 + 150 * len(out), "frames": STACKS["A2"]})
    return out


def block(addr: int, size: int, requested: int, state: str, frames: list[dict]) -> dict:
    return {"address": addr, "size": size, "requested_size": requested, "state": state,
            "frames": frames}


def segment(addr: int, total: int, blocks: list[dict], frames: list[dict]) -> dict:
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    requested = sum(b["requested_size"] for b in blocks if b["state"] != "inactive")
    return {"device": 0, "address": addr, "total_size": total, "allocated_size": allocated,
            "active_size": active, "requested_size": requested, "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": frames, "blocks": blocks}


def snapshot() -> dict:
    """The whole snapshot dict, top-level keys as in torch 2.13."""
    segments = [
        segment(S1, 20 * M, [block(S1, 8 * M, 8 * M, "active_allocated", []),
                             block(S1 + 8 * M, 12 * M, 0, "inactive", [])], []),
        segment(S2, 32 * M, [block(S2, 8 * M, 8 * M, "active_allocated", STACKS["G1"]),
                             block(S2 + 8 * M, 10 * M, 10 * M, "active_allocated", STACKS["G2"]),
                             block(S2 + 18 * M, 14 * M, 0, "inactive", [])], STACKS["A2"]),
    ]
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": False,
                "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False,
                "roundup_power2_divisions": {str(2**i): 0 for i in range(16)}}
    return {"segments": segments, "device_traces": [device_trace()],
            "allocator_settings": settings, "external_annotations": []}


def write(path: Path = OUT) -> Path:
    """Pickle the snapshot to `path` (what `torch.cuda.memory._dump_snapshot` does)."""
    with open(path, "wb") as f:
        pickle.dump(snapshot(), f, protocol=PROTOCOL)
    return path


if __name__ == "__main__":
    print(write())
