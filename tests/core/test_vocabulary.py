"""The shared vocabulary: one definition per option, device defaults in one place, and the
flags removed (each refused in one line naming what replaced it)."""

from __future__ import annotations

import argparse

import pytest

from lmperf.core import vocabulary as voc


def parser(**kwargs) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    voc.add_options(p, ("size", "context", "precision", "warmup", "steps", "threads", "format"),
                    **kwargs)
    return p


def test_lists_sweep_and_singles_do_not():
    p = parser(lists=("context",))
    args = p.parse_args(["--context", "64", "128", "--size", "tiny"])
    assert args.context == [64, 128] and args.size == "tiny"


def test_device_dependent_defaults_stay_none_until_resolved():
    args = parser().parse_args([])
    assert args.size is None and args.context is None and args.precision is None
    assert voc.device_defaults("bench", "cpu")["size"] == ["tiny", "mini"]
    assert voc.device_defaults("bench", "cuda", "2025")["context"] == [128, 256, 512, 1024]


def test_json_flag_is_bare_or_a_file():
    p = parser()
    assert p.parse_args(["--json"]).json == "-"
    assert p.parse_args(["--json", "x.json"]).json == "x.json"
    assert p.parse_args([]).json is None


def test_thread_policy():
    assert voc.resolve_threads(None, "cpu") == 1
    assert voc.resolve_threads(None, "cuda") == 0
    assert voc.resolve_threads(4, "cpu") == 4


@pytest.mark.parametrize("command, flag", [(c, f) for c, table in voc.RENAMED.items()
                                            for f in table])
def test_a_removed_flag_exits_2_naming_the_current_one(command, flag, capsys):
    from lmperf.cli import build_parser, main

    words = [command, "underflow"] if command == "amp" else [command]
    assert main([*words, flag, "128"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"lmperf {command}: error: {flag} was ")
    assert voc.RENAMED[command][flag] in err
    assert main([*words, f"{flag}=128"]) == 2 and flag in capsys.readouterr().err
    # not an option any more, not even a hidden one
    parser = build_parser(command)._subparsers._group_actions[0].choices[command]
    if command == "amp":
        parser = parser._subparsers._group_actions[0].choices["underflow"]
    assert flag not in parser._option_string_actions


def test_the_removed_flags_example(capsys):
    from lmperf.cli import main

    assert main(["attention", "--seq", "128"]) == 2
    assert capsys.readouterr().err == "lmperf attention: error: --seq was renamed --context\n"


def test_help_lists_accepted_names():
    text = parser().format_help()
    assert "fp32" in text and "tiny" in text and "(0 allowed)" in text


def test_checkpoint_is_one_option_parsed_by_one_function():
    """Issue 41: --checkpoint is declared once (bench, memory and dist train add the same
    Option) and every spelling goes through `checkpoint_policy` to its canonical value."""
    from lmperf.cli import build_parser
    from lmperf.errors import SpecError

    cases = {0: "none", "0": "none", 1: "full", "1": "full", "every-1": "full", "full": "full",
             "OP": "op", "every-3": "every-3", 4: 4, "4": 4, "none": "none"}
    for given, canonical in cases.items():
        assert voc.checkpoint_policy(given) == canonical
    for bad in (-1, "every-0", "every-", "groups", 2.5, True, None):
        with pytest.raises(SpecError, match="--checkpoint: unknown checkpointing policy"):
            voc.checkpoint_policy(bad)
    assert sorted(["op", 2, "none", "every-2", "full", 8], key=voc.checkpoint_order) == [
        "none", "full", 2, 8, "every-2", "op"]
    for command in ("bench", "memory", "dist"):
        parser = build_parser(command)
        helps = [a.help for p in [parser, *[c for a in parser._actions if a.choices and
                                            isinstance(a.choices, dict)
                                            for c in a.choices.values()]]
                 for a in p._actions if "--checkpoint" in a.option_strings]
        assert helps and all(h.startswith(voc.OPTIONS["checkpoint"].help) for h in helps), command
