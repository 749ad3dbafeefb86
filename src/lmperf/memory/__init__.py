"""Where the memory goes: peaks per phase, saved activations, estimates, checkpointing, snapshots."""
