"""Tests of bigbatch/floor/: files, processes and the checks below everything else."""
