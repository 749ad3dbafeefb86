"""`lmperf compare`: is NEW faster than BASE, phase by phase, beyond the noise?

`lmperf.compare(...)` is `lmperf.questions.compare.api.compare`.
"""
