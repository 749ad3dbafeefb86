"""Timing statistics, FLOP counting and the analytic FLOP formula."""
