"""Benchmarking: run specs, steps per mode, the runner, the isolated launcher and the sweep."""
