"""`lmperf doctor`: does each path lmperf relies on work on this machine? Checked for real.

`lmperf.doctor(...)` is `lmperf.questions.doctor.api.doctor`.
"""
