"""Tests through the real command line, end to end: a run, its resume and restart, and what every command refuses."""
