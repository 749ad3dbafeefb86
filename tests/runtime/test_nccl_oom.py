"""NCCL's own out-of-memory errors are 'oom' rows (issue 19, finding 8).

NCCL allocates its buffers with cudaMalloc, outside the caching allocator (so outside lmperf's
CUDA cap); when that fails torch raises torch.distributed.DistBackendError with NCCL's last
warning in the text. The messages below follow torch's getNcclErrorDetailStr layout with NCCL's
warning texts (CUDACHECK, alloc.h), as seen in public bug reports."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from lmperf.core.outcome import failure
from lmperf.runtime.device import is_oom

HEAD = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3699, "
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n")


@pytest.mark.parametrize("last", [
    "Cuda failure 2 'out of memory'",
    "Cuda failure 'out of memory'",  # older NCCL: no error number
    "Failed to CUDA calloc 6291456 bytes",
    "Failed to CUDA calloc async 2432 bytes",
    "Failed to malloc 1048576 bytes",
])
def test_nccls_out_of_memory_is_an_oom_row(last):
    exc = dist.DistBackendError(HEAD + last)
    assert is_oom(exc)
    assert failure(exc, "training")["status"] == "oom"


@pytest.mark.parametrize("last", [
    "Cuda failure 999 'unknown error'",
    "Cuda failure 'invalid resource handle'",
    "socketProgress: Connection closed by remote peer",
])
def test_other_nccl_errors_stay_errors(last):
    exc = dist.DistBackendError(HEAD + last)
    assert not is_oom(exc)
    assert failure(exc, "training")["status"] == "error"
