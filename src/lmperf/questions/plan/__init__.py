"""`lmperf plan`: what to run on GPUs you may not have yet, will it fit, how fast will it be."""
