"""The RL loop: one long-running stage that generates, verifies, trains and syncs weights (sync, colocated
async, separate async), and the pure scheduling policies it uses (admission, role switching, dynamic
sampling)."""
