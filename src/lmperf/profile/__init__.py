"""Where the time goes: annotated ranges, torch.profiler and Nsight Systems backends, per-phase tables."""
