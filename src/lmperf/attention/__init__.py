"""`lmperf attention`: attention implementations swept over shapes, one isolated process each."""
