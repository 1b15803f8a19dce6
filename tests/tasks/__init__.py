"""Tests of bigbatch/tasks/: COCO evaluation, results files and detection end to end."""
