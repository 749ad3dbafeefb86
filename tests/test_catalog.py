"""Every "module:function" string lmperf names resolves: the catalog's, and every job spec's
runner (and worker); every question has its package, subcommand and API function."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import lmperf
from lmperf.catalog import BY_KIND, PRELOAD, QUESTIONS, WARM_UP
from lmperf.core.jobs import resolve

SRC = Path(lmperf.__file__).parent
TARGET = re.compile(r'"(lmperf(?:\.\w+)+:\w+)"')


def test_every_catalog_entry_resolves():
    for q in QUESTIONS:
        for target in (q.api, q.report, q.summary, *(r for _, r in q.more_kinds)):
            if target is not None:
                assert callable(resolve(target)), target
        assert hasattr(importlib.import_module(q.cli), "add_parser"), q.cli
        assert importlib.import_module(q.package).__name__ == q.package
    assert callable(resolve(WARM_UP))
    for name in PRELOAD:
        importlib.import_module(name)


def test_every_module_function_string_in_the_source_resolves():
    found = []
    for path in SRC.rglob("*.py"):
        for target in TARGET.findall(path.read_text()):
            found.append(target)
            assert resolve(target) is not None, f"{path.relative_to(SRC)}: {target}"
    assert len(found) >= 10


def test_every_job_spec_names_a_runner_that_exists():
    specs = []
    for info in pkgutil.walk_packages(lmperf.__path__, "lmperf."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            runner = getattr(obj, "runner", None)
            if isinstance(obj, type) and isinstance(runner, str) and ":" in runner:
                specs.append(obj)
                assert callable(resolve(runner)), f"{obj.__qualname__}.runner = {runner}"
                kind = getattr(obj, "kind", None)
                if kind == "probe":  # core.capfloor's: what a job maps, never a written record
                    continue
                assert kind in BY_KIND, f"{obj.__qualname__}.kind = {kind!r} is no question's"
    assert len(specs) >= 6
