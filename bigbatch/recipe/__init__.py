"""The large-batch recipe: optimizers, schedules and the rest, each one small idea."""
