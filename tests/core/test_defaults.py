"""Defaults are declared once: for every command, every keyword of its API function that is also
a flag of its subcommand has the same default in both (the CLI only adds where records go)."""

from __future__ import annotations

import argparse
import inspect

import pytest

from lmperf.catalog import QUESTIONS
from lmperf.cli import build_parser
from lmperf.core.jobs import resolve
from lmperf.model.presets import DEFAULT_COURSE

# Where the CLI and the API differ on purpose, and why:
# out: the CLI appends to results/<command>.jsonl, the API keeps records in memory (None);
# plots: train's CLI draws into train-plots/ beside --out, the API draws only when asked.
CLI_ONLY_DEFAULTS = {"out", "plots"}
# --compile takes off/on on the command line, a bool in Python.
SPELLED = {"off": False, "on": True}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _cli_defaults(parser: argparse.ArgumentParser) -> dict[str, object]:
    # The first action of a dest is the flag.
    defaults: dict[str, object] = {}
    for action in parser._actions:
        if action.dest != "help" and action.dest not in defaults:
            defaults[action.dest] = action.default
    return defaults


def _same(cli: object, api: object, name: str) -> bool:
    def norm(v: object) -> object:
        v = [SPELLED.get(x, x) if isinstance(x, str) else x for x in v] \
            if isinstance(v, (list, tuple)) else (SPELLED.get(v, v) if isinstance(v, str) else v)
        return v[0] if isinstance(v, list) and len(v) == 1 else v

    if name == "course" and api is None:  # None: the current edition, resolved in one place
        return cli == DEFAULT_COURSE
    return norm(cli) == norm(api)


def _cases() -> list[tuple[str, argparse.ArgumentParser, str]]:
    sub = _subparsers(build_parser())
    cases = []
    for q in QUESTIONS:
        parser = sub[q.command]
        nested = _subparsers(parser)
        for name, p in ({"": parser} | nested).items():
            cases.append((f"{q.command} {name}".strip(), p, q.api))
    return cases


@pytest.mark.parametrize("command, parser, api", _cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_cli_and_api_defaults_agree(command, parser, api):
    cli = _cli_defaults(parser)
    signature = inspect.signature(resolve(api))
    compared = 0
    for name, param in signature.parameters.items():
        if param.default is inspect.Parameter.empty or name in CLI_ONLY_DEFAULTS or name not in cli:
            continue
        compared += 1
        assert _same(cli[name], param.default, name), (
            f"lmperf {command}: --{name.replace('_', '-')} defaults to {cli[name]!r} on the command "
            f"line but {param.default!r} in {api}")
    assert compared or command in ("compare", "report", "amp"), f"{command}: nothing compared"
