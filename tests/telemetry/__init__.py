"""Tests of bigbatch/telemetry/: the gradient noise scale, per-layer update sizes and the run's instruments."""
