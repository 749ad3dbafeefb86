"""The parts every spec is composed of, each defined once with its checks: the model's shape
(`ModelShape`: a size preset of a course edition and the dimensions it resolved to), where a job
runs (`OnDevice`), and whether the model is compiled (`Compiled`). Specs inherit the parts they
have; a record's spec stays one flat dict of fields (`dataclasses.asdict`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lmperf.errors import SpecError
from lmperf.model.presets import COURSES, DEFAULT_COURSE, resolve_preset
from lmperf.names import COMPILE_MODES, DEVICES
from lmperf.validate import as_flag, check_fields

SHAPE_FIELDS: tuple[str, ...] = ("d_model", "num_layers", "num_heads", "d_ff")


@dataclass(frozen=True)
class ModelShape:
    """The shape fields of a spec (its first fields; a spec adds its own after them).

    Attributes:
        size: the preset that gave the shape (or what a user's factory is told it is).
        d_model, num_layers, num_heads, d_ff: the resolved shape.
        course: the edition of CS336 whose table defined `size` ('2025' or '2026': the same
            name can mean different shapes, 2025's xl is 1600 wide, 2026's 2560); keyword-only.
    """

    size: str
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    course: str = field(default=DEFAULT_COURSE, kw_only=True)

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

    def check_shape(self) -> None:
        """SpecError for a non-positive dimension or an unknown course edition."""
        check_fields(self, choices={"course": COURSES}, positive=SHAPE_FIELDS)

    def dims(self) -> str:
        """'d=768 L=12 H=12 ff=3072': the shape that was run, for tables and labels."""
        return dims(self.__dict__)


def dims(fields: dict, vocab: bool = False) -> str:
    """'d=768 L=12 H=12 ff=3072' from shape fields (a spec's, or what was read off a built
    model: '?' where a field is None); with `vocab`, ' V=32000' after them."""
    get = lambda name: "?" if fields.get(name) is None else fields[name]  # noqa: E731
    return (f"d={get('d_model')} L={get('num_layers')} H={get('num_heads')} ff={get('d_ff')}"
            + (f" V={get('vocab_size')}" if vocab else ""))


def record_dims(record: dict) -> str:
    """The shape a record's run had: read off its built model, vocabulary included, where the
    record has it (`model_shape`: a user's model), else its spec's (a preset's shape)."""
    shape = record.get("model_shape")
    return dims(shape, vocab=True) if shape else dims(record["spec"])


@dataclass(frozen=True, kw_only=True)
class OnDevice:
    """Where a job runs, and from which seed.

    Attributes:
        device: 'cpu' or 'cuda' (already resolved from 'auto').
        threads: torch's intra-op CPU threads (0: torch's default; see core.vocabulary).
        seed: seeds the weights and the data (each spec says which data).
    """

    device: str = "cpu"
    threads: int = 0
    seed: int = 0

    def check_on_device(self) -> None:
        """SpecError for an unknown device or a negative thread count or seed."""
        check_fields(self, choices={"device": DEVICES}, non_negative=("threads", "seed"),
                     named=as_flag)


@dataclass(frozen=True, kw_only=True)
class Compiled:
    """Whether the model runs through `torch.compile` (its first step compiles; that step is
    timed apart from the others), and `compile_mode`, torch.compile's mode."""

    compile: bool = False
    compile_mode: str = "default"

    def check_compiled(self) -> None:
        """SpecError for a non-boolean `compile` or an unknown mode."""
        if not isinstance(self.compile, bool):
            raise SpecError(f"compile must be true or false, got {self.compile!r}")
        check_fields(self, choices={"compile_mode": COMPILE_MODES})
