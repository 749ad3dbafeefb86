"""ModelShape: the model's shape as every spec that builds the reference LM names it (a size
preset and the dimensions it resolved to), defined once and inherited by the specs."""

from __future__ import annotations

from dataclasses import dataclass

from lmperf.errors import SpecError
from lmperf.model.presets import resolve_preset

SHAPE_FIELDS: tuple[str, ...] = ("d_model", "num_layers", "num_heads", "d_ff")


@dataclass(frozen=True)
class ModelShape:
    """The shape fields of a spec (its first fields; a spec adds its own after them).

    Attributes:
        size: the preset that gave the shape (or what a user's factory is told it is).
        d_model, num_layers, num_heads, d_ff: the resolved shape.
    """

    size: str
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int

    @staticmethod
    def of_size(size: str, course: str) -> dict[str, int]:
        """The dimensions of preset `size` in the `course` edition's table (and its own
        vocabulary when it has one, as `vocab_size`); SpecError naming the accepted sizes."""
        try:
            preset = resolve_preset(size, course)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        dims = {f: getattr(preset, f) for f in SHAPE_FIELDS}
        if preset.vocab_size is not None:
            dims["vocab_size"] = preset.vocab_size
        return dims

    def dims(self) -> str:
        """'d=768 L=12 H=12 ff=3072': the shape that was run, for tables and labels."""
        return f"d={self.d_model} L={self.num_layers} H={self.num_heads} ff={self.d_ff}"
