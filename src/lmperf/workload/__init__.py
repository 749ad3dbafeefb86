"""The training workload every timing question shares: the run spec (model shape, batch,
precision, step mode), building model + batch + optimizer for it, the step functions (one
training step for bench, profile, memory and train) and the per-phase memory probe."""
