"""Training: the loop, schedules, checkpoints."""
