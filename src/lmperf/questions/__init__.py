"""One package per question lmperf answers (the table of them is `lmperf.catalog`)."""
