"""`lmperf profile`: where the time goes: annotated ranges under torch.profiler, per-phase tables.
`lmperf.profile(...)` is `lmperf.questions.profile.api.profile`."""
