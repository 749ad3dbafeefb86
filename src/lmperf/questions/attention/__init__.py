"""`lmperf attention`: attention implementations swept over shapes, one isolated process each.

`lmperf.attention(...)` is `lmperf.questions.attention.api.attention`.
"""
