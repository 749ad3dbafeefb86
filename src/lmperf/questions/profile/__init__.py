"""`lmperf profile`: where the time goes: annotated ranges, torch.profiler and Nsight Systems
backends, per-phase tables.

`lmperf.profile(...)` is `lmperf.questions.profile.api.profile`.
"""
