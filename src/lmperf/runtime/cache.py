"""Measured figures kept between commands: small JSON objects under $XDG_CACHE_HOME/lmperf
(~/.cache/lmperf without the variable), rewritten whole and atomically. One that cannot be read
is empty; one that cannot be written only costs the next command another measurement."""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_file(name: str) -> Path:
    """$XDG_CACHE_HOME/lmperf/`name`."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "lmperf" / name


def read_cache(name: str) -> dict:
    """The cache `name` (empty where it is missing, unreadable or not a JSON object)."""
    try:
        cache = json.loads(cache_file(name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def update_cache(name: str, entries: dict) -> None:
    """Add `entries` to the cache `name`; a concurrent reader sees the old file or the new."""
    path = cache_file(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**read_cache(name), **entries}, indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass
