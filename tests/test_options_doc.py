"""docs/options.md is what scripts/gen_options.py writes from the CLI's parser today: a flag added,
removed or re-worded without regenerating the page fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_options", REPO / "scripts" / "gen_options.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_options_page_matches_the_parser():
    gen = _generator()
    fresh = gen.generate()
    page = (REPO / "docs" / "options.md").read_text()
    assert page == fresh, ("docs/options.md is stale: run `.venv/bin/python scripts/gen_options.py` "
                           "and commit the result")


def test_every_command_and_every_visible_flag_is_listed():
    import argparse

    from lmperf.cli import build_parser

    gen = _generator()
    text = gen.generate()
    commands = gen._subparsers(build_parser())
    assert {name for name, _ in commands} >= {"bench", "profile", "memory", "amp", "train",
                                             "attention", "dist", "doctor", "compare", "report",
                                             "table"}
    for name, parser in commands:
        assert f"## `lmperf {name}`" in text
        for action in parser._actions:
            if action.help is argparse.SUPPRESS or not action.option_strings:
                continue
            if isinstance(action, argparse._HelpAction):
                continue
            assert f"`{action.option_strings[0]}" in text, (name, action.option_strings)
