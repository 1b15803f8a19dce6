"""Tests of bigbatch/config/: the config's errors and run directories written by earlier versions."""
