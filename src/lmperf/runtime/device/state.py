"""Global numeric state a run sets and records: TF32 / float32 matmul precision, RNG seeds."""

from __future__ import annotations

import torch


# torch >= 2.9 has a second, per-backend API for fp32 precision (`fp32_precision` = "ieee" /
# "tf32" / "none", "none" inheriting from the backend's "all" then the generic setting; torch
# 2.13's aten/src/ATen/Context.cpp). The legacy `torch.get_float32_matmul_precision()` is not
# updated by it (it reads stale after `torch.backends.cuda.matmul.fp32_precision = "ieee"`),
# and it and `torch.backends.cuda.matmul.allow_tf32` raise RuntimeError once the two APIs
# disagree ("... you have used mix of the legacy and new APIs ..."). So the new API is recorded
# and saved where it exists, and every legacy read is guarded.
_NEW_API: dict[str, tuple[str, ...]] = {
    "cuda_matmul_fp32_precision": ("cuda", "matmul"),  # cuBLAS fp32 matmuls
    "mkldnn_matmul_fp32_precision": ("mkldnn", "matmul"),  # oneDNN (CPU) fp32 matmuls
    "cudnn_conv_fp32_precision": ("cudnn", "conv"),  # cuDNN convolutions
}


def _new_api(path: tuple[str, ...]) -> object | None:
    """The `torch.backends.<path>` object holding `fp32_precision`, or None before torch 2.9."""
    obj: object = torch.backends
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    try:
        getattr(obj, "fp32_precision")
    except (AttributeError, RuntimeError):
        return None
    return obj


def _legacy_precision() -> str | None:
    """`torch.get_float32_matmul_precision()`, or None where it raises (the APIs were mixed)."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return None


def set_tf32(enabled: bool) -> None:
    """Allow or forbid TF32 for fp32 matmuls and cuDNN convolutions (harmless on a CPU build).

    Matmuls go through `torch.set_float32_matmul_precision` only: it sets the legacy flag and,
    on torch >= 2.9, the new API's cuda and mkldnn matmul precisions together, so both agree.
    Mixing in the legacy `allow_tf32` flag leaves torch >= 2.9 unable to report its precision.
    """
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled


def get_tf32() -> dict[str, object]:
    """What `set_tf32` changes, for `restore_tf32`: the legacy matmul precision (None where it
    cannot be read), cuDNN's allow_tf32, and the new API's precisions where they exist."""
    saved: dict[str, object] = {"float32_matmul_precision": _legacy_precision(),
                                "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}
    for key, path in _NEW_API.items():
        if (obj := _new_api(path)) is not None:
            saved[key] = obj.fp32_precision  # type: ignore[attr-defined]
    return saved


def restore_tf32(saved: dict[str, object]) -> None:
    """Put back what `get_tf32` returned: the legacy settings first (they also set the new
    API's), then the new API's own values, which win where the two differed."""
    if saved.get("float32_matmul_precision") is not None:
        torch.set_float32_matmul_precision(saved["float32_matmul_precision"])  # type: ignore[arg-type]
    torch.backends.cudnn.allow_tf32 = bool(saved["cudnn_allow_tf32"])
    for key, path in _NEW_API.items():
        if key in saved and (obj := _new_api(path)) is not None:
            obj.fp32_precision = saved[key]  # type: ignore[attr-defined]


def tf32_state() -> dict[str, object]:
    """The TF32 / float32 matmul precision settings in force, for a record's env.

    `cuda_matmul_tf32` is what cuBLAS does with fp32 matmuls: the new API's verdict where it
    exists (torch >= 2.9), else the legacy flag's. The legacy `float32_matmul_precision` is
    kept for older records' readers; where the new API contradicts it, it is marked stale. A
    setting torch cannot report (the APIs were mixed) is recorded as the error's text.
    """
    readers = {
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "cuda_matmul_allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
    }
    for key, path in _NEW_API.items():
        if (obj := _new_api(path)) is not None:
            readers[key] = lambda obj=obj: obj.fp32_precision  # type: ignore[attr-defined]
    state: dict[str, object] = {}
    for key, read in readers.items():
        try:
            state[key] = read()
        except RuntimeError as exc:
            state[key] = f"unreadable: {str(exc).splitlines()[0][:120]}"
    new = state.get("cuda_matmul_fp32_precision")
    legacy = state["float32_matmul_precision"]
    if new is not None:
        state["cuda_matmul_tf32"] = new == "tf32"
        if legacy in ("highest", "high", "medium") and (legacy != "highest") != (new == "tf32"):
            state["float32_matmul_precision"] = (f"stale: {legacy!r} (legacy API), while "
                                                 f"torch.backends.cuda.matmul.fp32_precision "
                                                 f"is {new!r}")
    else:
        allow = state["cuda_matmul_allow_tf32"]
        state["cuda_matmul_tf32"] = allow if isinstance(allow, bool) else None
    return state


def seed_all(seed: int) -> None:
    """Seed torch's CPU and (where present) CUDA generators."""
    torch.manual_seed(seed)  # also seeds every CUDA device


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on `device` seeded with `seed` (for reproducible random batches)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
