"""Global numeric state a run sets and records: TF32 / float32 matmul precision, RNG seeds."""

from __future__ import annotations

import torch


def set_tf32(enabled: bool) -> None:
    """Allow or forbid TF32 for fp32 matmuls and cuDNN convolutions (harmless on a CPU build).

    Matmuls go through `torch.set_float32_matmul_precision` only: mixing it with the legacy
    `allow_tf32` flag leaves torch >= 2.9 unable to report its precision.
    """
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled


def get_tf32() -> tuple[str, bool]:
    """The (float32 matmul precision, cuDNN allow_tf32) pair, for `restore_tf32`."""
    return torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32


def restore_tf32(saved: tuple[str, bool]) -> None:
    """Put back what `get_tf32` returned."""
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]


def tf32_state() -> dict[str, object]:
    """The TF32 / float32 matmul precision settings in force (a setting torch cannot report,
    e.g. after a user mixed its legacy and new APIs, is recorded as the error's text)."""
    readers = {
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "cuda_matmul_allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
    }
    state: dict[str, object] = {}
    for key, read in readers.items():
        try:
            state[key] = read()
        except RuntimeError as exc:
            state[key] = f"unreadable: {str(exc).splitlines()[0][:120]}"
    return state


def seed_all(seed: int) -> None:
    """Seed torch's CPU and (where present) CUDA generators."""
    torch.manual_seed(seed)  # also seeds every CUDA device


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on `device` seeded with `seed` (for reproducible random batches)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
