"""Tests of lmperf.questions.train: data sources, the step, the loop's stop rules, determinism, golden curves, CLI."""
