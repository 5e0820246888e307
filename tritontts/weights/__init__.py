"""Checkpoint reading (files, configs, strict loading, weight-norm folding) and random
weights for the tiny test checkpoints."""
