"""The shared vocabulary: one definition per option, device defaults in one place, aliases."""

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
    assert voc.fill_defaults("bench", "cpu", {"size": None, "batch": 8}) == {
        "size": ["tiny", "mini"], "batch": 8}
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


def test_deprecated_alias_sets_the_new_option_and_warns(capsys):
    p = parser(lists=("context",))
    voc.add_alias(p, "--seq", "--context", many=True, type=int)
    args = p.parse_args(["--seq", "256", "512"])
    assert args.context == [256, 512]
    assert "--seq is deprecated; use --context" in capsys.readouterr().err


def test_help_lists_accepted_names():
    text = parser().format_help()
    assert "fp32" in text and "tiny" in text and "(0 allowed)" in text
