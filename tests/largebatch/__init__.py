"""Tests of bigbatch/largebatch/: LR and batch schedules, optimizers, clipping, norms, EMA, precision, AdaScale."""
