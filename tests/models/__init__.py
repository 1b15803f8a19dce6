"""Tests of bigbatch/models/: the detectors and the classifiers' memory format."""
