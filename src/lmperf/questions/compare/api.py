"""`lmperf.compare(base, new)`: match two sets of records by spec and compare every timed phase;
a Report (see `lmperf.questions.compare.report.build_report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lmperf.questions.compare.match import check_fields, match, select, two_values
from lmperf.questions.bench.rounds import latest_view
from lmperf.questions.compare.records import MAX_LOAD
from lmperf.questions.compare.report import build_report
from lmperf.core.report import Report
from lmperf.errors import SpecError
from lmperf.measure.compare import LEVEL, MIN_EFFECT, RESAMPLES

Source = str | Path | Sequence[dict]


def _load(source: Source) -> tuple[list[dict], str]:
    """(records, name) of a results file or of a list of records already in memory. A `--rounds`
    sweep's round records are left out where their pooled record is present (their samples are
    in it, still grouped by round)."""
    if isinstance(source, (str, Path)):
        from lmperf.results.store import read_records

        return latest_view(read_records(Path(source))), str(source)
    records = list(source)
    if not all(isinstance(r, dict) and isinstance(r.get("spec"), dict) and "kind" in r
               and "status" in r for r in records):
        raise SpecError("records must be lmperf records (dicts with kind, status and spec)")
    from lmperf.results.record import migrate

    return latest_view(migrate(records)), "the records given"


def _check(level: float, min_effect: float, resamples: int, max_load: float | None) -> None:
    if max_load is not None and not max_load > 0:
        raise SpecError(f"--max-load must be positive, got {max_load:g}")
    if not 0.5 <= level < 1.0:
        raise SpecError(f"--confidence must be in [0.5, 1), got {level:g}")
    if min_effect < 0:
        raise SpecError(f"--min-effect must be a non-negative percentage, got {min_effect:g}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise SpecError(f"--resamples must be an integer of at least 100, got {resamples!r}")


def compare(base: Source, new: Source | None = None, *,
            by: Sequence[str] | None = None, ignore: Sequence[str] = (),
            kind: str | None = None, confidence: float = LEVEL,
            min_effect: float = MIN_EFFECT * 100, max_load: float | None = MAX_LOAD,
            resamples: int = RESAMPLES, seed: int = 0) -> Report:
    """Compare NEW with BASE, phase by phase.

    Args:
        base, new: results files (or lists of records). Without `new`, `by` must split `base`.
        by: (FIELD, A, B): BASE is the records whose spec FIELD is A, NEW those where it is B
            (e.g. ("precision", "fp32", "bf16-mixed")); FIELD is then left out of matching.
            FIELD alone: the records must hold exactly two values of it (an A/B sweep, e.g.
            `lmperf bench --model reference mine:factory --rounds 5`); the first that ran is A.
        ignore: further spec fields left out of matching (e.g. "model", "steps").
        kind: only records of this kind.
        confidence: level of the bootstrap intervals (0.95).
        min_effect: smallest change, in percent, reported as slower or faster (15).
        max_load: a change seen when a CPU run of either side started with a 1-minute load
            average above this many per CPU is 'inconclusive' instead (1.25; None: never).
        resamples, seed: of the bootstrap (seeded: the same inputs give the same report).

    Returns a Report whose frame has one row per matched spec x timed phase: medians, the ratio
    NEW/BASE, its interval and a verdict ('slower', 'faster', 'no significant change',
    'inconclusive', 'too few samples'); see `lmperf.questions.compare.report.build_report`. Specs found
    on one side only, or not ok, are rows of its 'not compared' table. Raises SpecError for bad
    input, ResultsFileError for an unreadable file.
    """
    _check(confidence, min_effect, resamples, max_load)
    base_records, base_name = _load(base)
    new_records, new_name = _load(new) if new is not None else (base_records, base_name)
    if kind is not None:
        base_records = [r for r in base_records if r["kind"] == kind]
        new_records = [r for r in new_records if r["kind"] == kind]
    sides = (base_name, new_name)
    drop = list(ignore)
    if by is not None:
        if isinstance(by, str):
            by = [by]
        if len(by) == 1:  # an A/B sweep: its two values, in the order they ran
            by = [by[0], *two_values(base_records if new is None else base_records + new_records,
                                     str(by[0]))]
        if len(by) != 3:
            raise SpecError(f"--by takes FIELD, or FIELD A B; got {' '.join(map(str, by))}")
        field, a, b = (str(x) for x in by)
        base_records = select(base_records, field, a, base_name)
        new_records = select(new_records, field, b, new_name)
        sides = (f"{field}={a}" + (f" in {base_name}" if new is not None else ""),
                 f"{field}={b}" + (f" in {new_name}" if new is not None else ""))
        drop.append(field)
    elif new is None:
        raise SpecError("give two results files (BASE NEW), or one with --by FIELD A B")
    for name, records in (("BASE", base_records), ("NEW", new_records)):
        if not records:
            what = f" of kind {kind!r}" if kind else ""
            raise SpecError(f"{name} ({base_name if name == 'BASE' else new_name}) holds no "
                            f"records{what}")
    check_fields(base_records + new_records, ignore, "--ignore")
    matches, unmatched = match(base_records, new_records, drop)
    return build_report(matches, unmatched, sides=sides, level=confidence,
                        min_effect=min_effect / 100, resamples=resamples, seed=seed,
                        max_load=max_load)
