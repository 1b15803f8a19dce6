"""The training engine: the loop, checkpoints, process groups and run outputs."""
