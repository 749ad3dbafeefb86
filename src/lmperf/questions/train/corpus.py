"""The bundled corpus: a deterministic, generated English-like text (ASCII, byte-level tokens).

Nothing is downloaded: the text is made from a small grammar and a fixed pseudo-random stream,
so every machine gets the same bytes. Its sentence families (descriptions, arithmetic in words,
counting and weekdays, question/answer copying) have different kinds of structure, so that a
tiny model's loss keeps falling for a few hundred steps instead of flattening after the letter
statistics are learnt."""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

DEFAULT_BYTES = 320_000  # ~320 KB: large enough for ~100 k distinct windows of 64 tokens
CORPUS_SEED = 20_240_605  # fixed: the corpus is part of the project, not of a run

_NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
            "fourteen fifteen sixteen seventeen eighteen nineteen twenty").split()
_DAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
_ADJ = ("small quiet old bright heavy early green careful busy honest narrow warm silver "
        "patient orange empty ancient eager idle").split()
_NOUN = ("cat river teacher engine garden lamp sailor kettle forest owl baker tower child "
         "window violin apple island clock farmer letter").split()
_VERB = ("watches carries paints finds follows repairs opens remembers builds visits "
         "counts hides").split()
_PLACE = ("near the bridge", "in the morning", "behind the market", "after the rain",
          "under the old tree", "at the station", "before dinner", "by the sea")
_COLOUR = "red blue green yellow white black".split()


class _Stream:
    """splitmix64: a tiny PRNG written out here so the corpus never depends on `random`'s
    implementation, which Python does not promise to keep across versions."""

    def __init__(self, seed: int):
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """An integer in [0, n) (modulo bias is irrelevant for n << 2**64)."""
        return self.next() % n

    def pick(self, seq: Sequence[T]) -> T:
        """One element of `seq`, uniformly."""
        return seq[self.below(len(seq))]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _describe(r: _Stream) -> str:
    adj, noun = r.pick(_ADJ), r.pick(_NOUN)
    obj_adj, obj = r.pick(_ADJ), r.pick(_NOUN)
    return (f"{_article(adj)} {adj} {noun} {r.pick(_VERB)} the {obj_adj} {obj} "
            f"{r.pick(_PLACE)}.").capitalize()


def _arithmetic(r: _Stream) -> str:
    a, b = r.below(11), r.below(11)
    if r.below(2):
        return f"{_NUMBERS[a]} plus {_NUMBERS[b]} is {_NUMBERS[a + b]}.".capitalize()
    hi, lo = max(a, b), min(a, b)
    return f"{_NUMBERS[hi]} minus {_NUMBERS[lo]} is {_NUMBERS[hi - lo]}.".capitalize()


def _counting(r: _Stream) -> str:
    start = r.below(12)
    run = _NUMBERS[start:start + 3 + r.below(6)]
    return ("We count " + ", ".join(run) + ".") if len(run) > 1 else "We count nothing."


def _days(r: _Stream) -> str:
    i = r.below(7)
    return f"After {_DAYS[i]} comes {_DAYS[(i + 1) % 7]}.".capitalize()


def _question(r: _Stream) -> str:
    noun, colour = r.pick(_NOUN), r.pick(_COLOUR)
    return f"What colour is the {noun}? The {noun} is {colour}."


_FAMILIES: tuple[Callable[[_Stream], str], ...] = (
    _describe, _describe, _arithmetic, _arithmetic, _counting, _days, _question,
)


def generate(n_bytes: int = DEFAULT_BYTES, seed: int = CORPUS_SEED) -> bytes:
    """The bundled corpus: exactly `n_bytes` ASCII bytes of generated sentences in paragraphs.

    Deterministic for a given (n_bytes, seed); a prefix of a longer corpus with the same seed.
    """
    if n_bytes <= 0:
        raise ValueError(f"n_bytes must be positive, got {n_bytes}")
    r = _Stream(seed)
    parts: list[str] = []
    size = 0
    while size < n_bytes:
        # a paragraph of 3..8 sentences, then a blank line
        sentences = [r.pick(_FAMILIES)(r) for _ in range(3 + r.below(6))]
        paragraph = " ".join(sentences) + "\n\n"
        parts.append(paragraph)
        size += len(paragraph)
    return "".join(parts).encode("ascii")[:n_bytes]
