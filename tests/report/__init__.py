"""Tests of bigbatch/report/: the HTML report and what it reads as untrusted."""
