"""Tests of bigbatch/engine/: the training step, the trainer's wiring and hooks, checkpoints, memory, processes."""
