"""Pair the records of two sides (two files, or two groups of one file) by spec.

Two records measure the same thing when their kind and every spec field agree, except the
fields the comparison is about: the `--by` field, and any `--ignore`d ones (e.g. `model` when
BASE ran the reference LM and NEW a user's model). Run identity (`job_id`) and the environment
are outside the spec, so they never prevent a match; environment differences are warned about
by the report instead. Several ok records of one spec on one side (a sweep appended twice,
rounds) are pooled. Nothing is dropped silently: a spec found on one side only, or not ok on a
side, becomes an `Unmatched` entry with the reason, and the nearest spec on the other side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable

from lmperf.errors import SpecError

NONE_WORDS = ("none", "null", "reference")  # how a command line names a spec value of None


@dataclass
class Match:
    """One spec found ok on both sides: its kind, the spec fields that identify it (the compared
    and ignored fields left out), and the ok records of each side."""

    kind: str
    spec: dict
    base: list[dict] = field(default_factory=list)
    new: list[dict] = field(default_factory=list)


@dataclass
class Unmatched:
    """A spec that could not be compared: on which side(s) it was seen, and why."""

    kind: str
    spec: dict
    side: str
    reason: str
    differs: dict = field(default_factory=dict)  # field -> (BASE value, NEW value) of the nearest


def value_matches(value: object, text: str) -> bool:
    """Whether a spec value equals a value as typed on the command line ("64", "fp32", "true",
    "none" for a missing user model)."""
    if value is None:
        return text.lower() in NONE_WORDS
    if isinstance(value, bool):
        return text.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return str(value) == text


def select(records: list[dict], by: str, value: str, where: str) -> list[dict]:
    """The records whose spec field `by` equals `value`; SpecError naming the values there are
    when none does (or when no record has the field)."""
    seen = [r["spec"][by] for r in records if by in r["spec"]]
    if not seen:
        fields = sorted({k for r in records for k in r["spec"]})
        raise SpecError(f"--by {by}: no record in {where} has that spec field; fields: "
                        f"{', '.join(fields)}")
    chosen = [r for r in records if by in r["spec"] and value_matches(r["spec"][by], value)]
    if not chosen:
        values = sorted({json.dumps(v) if not isinstance(v, str) else v for v in seen})
        raise SpecError(f"--by {by}: no record in {where} has {by} = {value}; values there: "
                        f"{', '.join(values)}")
    return chosen


def two_values(records: list[dict], by: str) -> tuple[str, str]:
    """The two values of spec field `by` in `records`, as a command line writes them ('none' for
    None), in the order they first appear (an A/B sweep's A ran first); SpecError unless there
    are exactly two."""
    seen = list(dict.fromkeys(json.dumps(r["spec"][by]) for r in records if by in r["spec"]))
    texts = ["none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
             for v in map(json.loads, seen)]
    if len(texts) != 2:
        found = ", ".join(texts) if texts else "none (no record has that spec field)"
        raise SpecError(f"--by {by}: needs exactly two values of {by} (or give them: --by {by} A "
                        f"B); found {len(texts)}: {found}")
    return texts[0], texts[1]


def check_fields(records: Iterable[dict], names: Iterable[str], option: str) -> None:
    """SpecError when a field named by `option` (e.g. --ignore) is in no record's spec."""
    known = {k for r in records for k in r["spec"]}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SpecError(f"{option}: no record has spec field(s) {', '.join(unknown)}; fields: "
                        f"{', '.join(sorted(known))}")


def _key(record: dict, drop: frozenset[str]) -> tuple[str, str]:
    spec = {k: v for k, v in record["spec"].items() if k not in drop}
    return record["kind"], json.dumps(spec, sort_keys=True, separators=(",", ":"))


def _group(records: list[dict], drop: frozenset[str]) -> dict[tuple[str, str], list[dict]]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault(_key(r, drop), []).append(r)
    return groups


def _difference(a: dict, b: dict) -> list[str]:
    """'field a vs b' for every field where two specs differ."""
    names = list(a) + [k for k in b if k not in a]
    return [f"{k} {a.get(k, '-')} vs {b.get(k, '-')}" for k in names if a.get(k) != b.get(k)]


def _nearest(spec: dict, kind: str, others: list[tuple[str, dict]], label: str,
             base_first: bool) -> tuple[str, dict]:
    """('; nearest in NEW differs in steps 10 vs 20; add --ignore steps to compare them', {field:
    (BASE value, NEW value)}) for the spec on the other side with the fewest differing fields."""
    near = [o for k, o in others if k == kind]
    if not near:
        return "", {}
    best = min(near, key=lambda o: len(_difference(spec, o)))
    diffs = _difference(spec, best)
    shown = ", ".join(diffs[:3]) + (f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else "")
    if len(diffs) > 3:  # too far apart to be worth a hint
        return f"; nearest in {label} differs in {shown}", {}
    names = [d.split(" ", 1)[0] for d in diffs]
    pairs = {f: (spec.get(f, "-"), best.get(f, "-"))[:: 1 if base_first else -1] for f in names}
    return f"; nearest in {label} differs in {shown}; {ignore_hint(pairs)}", pairs


def ignore_hint(fields: Iterable[str]) -> str:
    return f"add --ignore {' '.join(fields)} to compare them"


def differ_finding(unmatched: list[Unmatched]) -> str | None:
    """'not compared: the sides differ in attention (naive vs sdpa); add --ignore attention to
    compare them', when every spec found on one side only differs from its nearest on the other
    in the same fields; else None."""
    one_side = [u for u in unmatched if u.side != "both"]
    if not one_side or len({tuple(u.differs) for u in one_side}) != 1 or not one_side[0].differs:
        return None
    values = {f: (sorted({str(u.differs[f][0]) for u in one_side}),
                  sorted({str(u.differs[f][1]) for u in one_side})) for f in one_side[0].differs}
    what = ", ".join(f"{f} ({'/'.join(b)} vs {'/'.join(n)})" for f, (b, n) in values.items())
    return f"not compared: the sides differ in {what}; {ignore_hint(values)}"


def _failed(records: list[dict]) -> str:
    r = records[-1]
    message = " ".join(str(r.get("message", "")).split())
    return f"{r['status']}" + (f": {message}" if message else "")


def match(base: list[dict], new: list[dict], drop: Iterable[str] = (),
          labels: tuple[str, str] = ("BASE", "NEW")) -> tuple[list[Match], list[Unmatched]]:
    """(matches in BASE's order, then unmatched entries) of two lists of records, ignoring the
    spec fields in `drop`. `labels` name the sides in the reasons."""
    drop = frozenset(drop)
    base_groups, new_groups = _group(base, drop), _group(new, drop)
    specs = {key: json.loads(key[1]) for key in list(base_groups) + list(new_groups)}
    matches, unmatched = [], []
    for key in dict.fromkeys(list(base_groups) + list(new_groups)):
        kind, spec = key[0], specs[key]
        b, n = base_groups.get(key, []), new_groups.get(key, [])
        b_ok = [r for r in b if r["status"] == "ok"]
        n_ok = [r for r in n if r["status"] == "ok"]
        if b_ok and n_ok:
            matches.append(Match(kind, spec, b_ok, n_ok))
        elif not n:
            why, pairs = _nearest(spec, kind, [(k[0], specs[k]) for k in new_groups], labels[1],
                                  True)
            unmatched.append(Unmatched(kind, spec, labels[0], f"only in {labels[0]}{why}", pairs))
        elif not b:
            why, pairs = _nearest(spec, kind, [(k[0], specs[k]) for k in base_groups], labels[0],
                                  False)
            unmatched.append(Unmatched(kind, spec, labels[1], f"only in {labels[1]}{why}", pairs))
        else:
            parts = [f"{label}: {_failed(rs)}" for label, rs, ok in
                     ((labels[0], b, b_ok), (labels[1], n, n_ok)) if not ok]
            unmatched.append(Unmatched(kind, spec, "both", "; ".join(parts)))
    return matches, unmatched
