"""The sqrt(N) rule for checkpointing groups (docs/commands/plan.md, "The simulated step")."""

from __future__ import annotations

import math


def sqrt_rule(num_blocks: int) -> int:
    """The sqrt(N) rule's group size: the integer nearest sqrt(N), at least 1."""
    return max(1, round(math.sqrt(num_blocks)))
