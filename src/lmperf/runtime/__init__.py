"""Device layer, precision regimes, peak FLOP/s table and environment capture."""
