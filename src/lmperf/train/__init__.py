"""`lmperf train`: a small LM trained once per precision regime (data, step, loop, report, plots)."""
