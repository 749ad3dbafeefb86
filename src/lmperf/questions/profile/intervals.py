"""Interval arithmetic for trace attribution: sorted arrays + searchsorted, no Python loops.

Every function takes interval starts and ends as float arrays (microseconds in this package) and
treats an interval as half-open [start, end). Lookups cost O((n + m) log m) for n points against
m intervals, so attributing every event of a trace stays linear in the events.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

# Kineto widens device copies of ranges by a nanosecond at each end (and rounds to 0.001 us).
END_SLACK_US = 0.005


def merged(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted [start, end) intervals covering the same points as the given ones."""
    starts, ends = np.asarray(starts, float), np.asarray(ends, float)
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] >= reach[:-1]  # a new group starts at or past everything before it
    return s[new], np.maximum.reduceat(e, np.flatnonzero(new))


def containing(ts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index into (sorted, disjoint) intervals of the one holding each ts, -1 where none."""
    ts = np.asarray(ts, float)
    if len(starts) == 0:
        return np.full(len(ts), -1)
    i = np.searchsorted(starts, ts, side="right") - 1
    hit = (i >= 0) & (ts < ends[np.clip(i, 0, None)])
    return np.where(hit, i, -1)


def innermost(ts: np.ndarray, ranges: pd.DataFrame, labels: Iterable[str], column: str = "name",
              until: np.ndarray | None = None) -> np.ndarray:
    """For each ts, the label of the innermost range (latest start) among `labels` holding it.

    `ranges` has start_us and end_us; `column` holds each range's label. Ranges of one label are
    merged first (nested copies count once). With `until` (interval ends), the whole interval
    [ts, until] must lie in the range, up to END_SLACK_US. Returns an object array, None where
    no range holds the point.
    """
    ts = np.asarray(ts, float)
    best_start = np.full(len(ts), -np.inf)
    label = np.full(len(ts), None, dtype=object)
    for name in labels:
        s, i = _holding(ts, ranges, column, name, until)
        start = np.where(i >= 0, s[np.clip(i, 0, None)] if len(s) else -np.inf, -np.inf)
        better = start > best_start
        label[better] = name
        best_start = np.maximum(best_start, start)
    return label


def _holding(ts: np.ndarray, ranges: pd.DataFrame, column: str, name: str,
             until: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(merged range starts of label `name`, index of the range holding each ts or -1); with
    `until`, the whole interval [ts, until] must lie in it, up to END_SLACK_US."""
    sel = ranges[ranges[column] == name]
    s, e = merged(sel["start_us"].to_numpy(), sel["end_us"].to_numpy())
    i = containing(ts, s, e)
    if until is not None and len(s):
        i = np.where(until <= e[np.clip(i, 0, None)] + END_SLACK_US, i, -1)
    return s, i


def first_containing(ts: np.ndarray, ranges: pd.DataFrame, labels: Iterable[str],
                     column: str = "label", until: np.ndarray | None = None) -> np.ndarray:
    """For each ts, the first label in `labels` (a priority order) with a range holding it.

    Unlike `innermost`, nesting does not decide: a point inside both a backward and a forward
    range (activation recomputation inside backward) gets whichever label comes first.
    """
    ts = np.asarray(ts, float)
    label = np.full(len(ts), None, dtype=object)
    for name in labels:
        _, i = _holding(ts, ranges, column, name, until)
        free = (i >= 0) & np.equal(label, None)
        label[free] = name
    return label


def self_times(ops: pd.DataFrame, chunk: int = 1 << 16) -> tuple[np.ndarray, np.ndarray]:
    """Self time (dur minus direct children on the same thread) and nesting depth of each op.

    One sweep over ops sorted by (tid, start, -dur): a stack holds the open ancestors (with
    their end and the sum of their children so far); an op whose start is at or past the top's
    end closes the top. The sweep reads the sorted columns `chunk` rows at a time as Python
    lists, so its working memory stays small on a trace of millions of ops.
    """
    n = len(ops)
    dur = ops["dur_us"].to_numpy(dtype=float)
    self_us = dur.copy()
    depth = np.zeros(n, dtype=np.int32)
    if n == 0:
        return self_us, depth
    tid_codes = pd.factorize(ops["tid"])[0]  # tids may be ints or strings
    start = ops["start_us"].to_numpy(dtype=float)
    order = np.lexsort((-dur, start, tid_codes))
    end = ops["end_us"].to_numpy(dtype=float)
    stack: list[list] = []  # [row, end, children's duration] of the open ops, outermost first
    prev_tid = None
    for lo in range(0, n, chunk):
        rows = order[lo:lo + chunk]
        depths = []
        for row, tid, st, en, du in zip(rows.tolist(), tid_codes[rows].tolist(),
                                        start[rows].tolist(), end[rows].tolist(),
                                        dur[rows].tolist()):
            if tid != prev_tid:
                for r, _, child in stack:
                    self_us[r] -= child
                stack.clear()
                prev_tid = tid
            while stack and st >= stack[-1][1]:
                r, _, child = stack.pop()
                self_us[r] -= child
            if stack:
                stack[-1][2] += du
            depths.append(len(stack))
            stack.append([row, en, 0.0])
        depth[rows] = depths
    for r, _, child in stack:
        self_us[r] -= child
    return self_us, depth

