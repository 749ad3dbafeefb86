"""Training data: the bundled corpus, a text file (`--data`, raw bytes) or a token file (`--tokens`,
flat uint16 or .npy), each a 1-D integer array (memory-mapped where it is a file); the train /
validation split and seeded random windows. Every problem with the input raises a one-line
SpecError naming the file and the fix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lmperf.errors import SpecError
from lmperf.questions.train.corpus import DEFAULT_BYTES, generate

BYTE_VOCAB = 256  # byte-level sources need a vocabulary of at least 256 ids
VAL_FRACTION = 0.1  # the last 10% of the ids (at least one window) is the validation split
_NPY_MAGIC = b"\x93NUMPY"


@dataclass(frozen=True)
class Corpus:
    """Token ids split into a training and a validation part: `source` ('builtin', 'text' or
    'tokens') and `name` (the file, or 'builtin'); `ids`, 1-D (a memmap for files, never copied
    whole), whose last `n_val` form the validation split; `max_id`, their largest id."""

    source: str
    name: str
    ids: np.ndarray
    n_val: int
    max_id: int

    @property
    def train(self) -> np.ndarray:
        """The training split (a view, no copy)."""
        return self.ids[: len(self.ids) - self.n_val]

    @property
    def val(self) -> np.ndarray:
        """The validation split (a view, no copy)."""
        return self.ids[len(self.ids) - self.n_val:]

    def describe(self) -> dict:
        """JSON-ready facts for the record: source, name, sizes of the splits, largest id."""
        return {"source": self.source, "name": self.name, "tokens": int(len(self.ids)),
                "train_tokens": int(len(self.ids) - self.n_val), "val_tokens": int(self.n_val),
                "max_id": int(self.max_id)}


def _check_file(path: Path, what: str) -> int:
    """Size of `path` in bytes; SpecError if it is missing, not a file, or empty."""
    if not path.exists():
        raise SpecError(f"{what} {path}: no such file")
    if not path.is_file():
        raise SpecError(f"{what} {path}: not a regular file")
    size = path.stat().st_size
    if size == 0:
        raise SpecError(f"{what} {path} is empty")
    return size


def load_builtin(n_bytes: int = DEFAULT_BYTES) -> np.ndarray:
    """The bundled corpus as byte ids (uint8, in memory)."""
    return np.frombuffer(generate(n_bytes), dtype=np.uint8)


def load_text(path: Path) -> np.ndarray:
    """A text file's raw bytes as ids 0..255 (uint8 memmap; no decoding, so any encoding works)."""
    _check_file(path, "--data")
    return np.memmap(path, dtype=np.uint8, mode="r")


def load_tokens(path: Path) -> np.ndarray:
    """A token file as a 1-D integer array: `.npy` (by its magic bytes) or raw uint16.

    Raises SpecError for an empty file, a raw file of odd length, or an `.npy` that is not a 1-D
    integer array.
    """
    size = _check_file(path, "--tokens")
    with open(path, "rb") as f:
        head = f.read(len(_NPY_MAGIC))
    if head == _NPY_MAGIC:
        try:
            ids = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise SpecError(f"--tokens {path}: not a readable .npy file ({exc})") from None
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise SpecError(f"--tokens {path}: expected a 1-D integer array, got shape "
                            f"{ids.shape} dtype {ids.dtype}")
        if ids.size == 0:
            raise SpecError(f"--tokens {path} holds no tokens")
        return ids
    if size % 2:
        raise SpecError(f"--tokens {path}: {size} bytes is not a whole number of uint16 ids; "
                        "a flat uint16 array (ids.astype(np.uint16).tofile(path)) is expected")
    return np.memmap(path, dtype=np.uint16, mode="r")


def _max_id(ids: np.ndarray, name: str) -> int:
    """Largest id; SpecError for a negative one (a signed .npy with garbage in it)."""
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0:
        pos = int(np.argmax(ids < 0))
        raise SpecError(f"{name} holds a negative token id {lo} (at position {pos})")
    return hi


def load_corpus(data: Path | None = None, tokens: Path | None = None,
                builtin_bytes: int = DEFAULT_BYTES) -> tuple[np.ndarray, str, str]:
    """(ids, source, name) for the chosen source: `tokens`, else `data`, else the bundled corpus."""
    if data is not None and tokens is not None:
        raise SpecError("give either --data (a text file) or --tokens (a token file), not both")
    if tokens is not None:
        return load_tokens(Path(tokens)), "tokens", str(tokens)
    if data is not None:
        return load_text(Path(data)), "text", str(data)
    return load_builtin(builtin_bytes), "builtin", "builtin"


def prepare_corpus(ids: np.ndarray, source: str, name: str, context: int,
                   vocab_size: int) -> Corpus:
    """Check the ids against the vocabulary and the context, and split them.

    The validation split is the last VAL_FRACTION of the ids, but at least one window of
    `context + 1`; the training split needs at least one window too. Raises SpecError naming
    the offending id (and its position) or the number of ids that would be needed.
    """
    what = {"tokens": "--tokens ", "text": "--data "}.get(source, "") + name
    max_id = _max_id(ids, what)
    if max_id >= vocab_size:
        pos = int(np.argmax(ids >= vocab_size))
        hint = ("pass --vocab-size " + str(max_id + 1) + " or more, or check that the file is "
                "a flat uint16 array") if source == "tokens" else f"pass --vocab-size {max_id + 1} or more"
        raise SpecError(f"{what} holds token id {max_id} (first out-of-range id at position "
                        f"{pos}), but the vocabulary has {vocab_size} ids (0..{vocab_size - 1}); "
                        f"{hint}")
    window = context + 1
    n = len(ids)
    n_val = max(int(n * VAL_FRACTION), window)
    if n - n_val < window:
        raise SpecError(f"{what} has {n} tokens: too short for context {context}; it needs at "
                        f"least {2 * window} (one window of {window} ids in each of the training "
                        "and validation splits). Use a smaller --context or more data")
    return Corpus(source=source, name=name, ids=ids, n_val=n_val, max_id=max_id)


def _windows(ids: np.ndarray, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather windows of `context + 1` ids at `starts` (B,) -> inputs, targets (B, T) int64."""
    index = starts.numpy()[:, None] + np.arange(context + 1)  # (B, T+1)
    block = torch.from_numpy(np.asarray(ids[index], dtype=np.int64))  # copies only B*(T+1) ids
    return block[:, :-1], block[:, 1:]  # targets are the inputs shifted left by one


class Batches:
    """Random training windows from a seeded CPU generator: the same seed, the same sequence.

    Each regime builds its own `Batches` with the run's seed, so every regime sees identical
    batches in identical order (on any device: the draw happens on the CPU).
    """

    def __init__(self, ids: np.ndarray, batch: int, context: int, seed: int):
        self.ids, self.batch, self.context = ids, batch, context
        self.high = len(ids) - context  # exclusive upper bound of a window's start
        self.gen = torch.Generator(device="cpu")
        self.gen.manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch: inputs and targets, each (B, T) int64 on the CPU."""
        starts = torch.randint(0, self.high, (self.batch,), generator=self.gen)
        return _windows(self.ids, starts, self.context)


def eval_windows(ids: np.ndarray, batches: int, batch: int, context: int,
                 seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of `batches` validation batches, each (inputs, targets) of shape (B, T).

    Drawn once (from `seed`) and reused at every evaluation and for every regime, so validation
    losses differ only by the model, not by which windows were drawn.
    """
    sampler = Batches(ids, batch, context, seed)
    return [sampler.next() for _ in range(batches)]
