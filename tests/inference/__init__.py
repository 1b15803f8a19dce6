"""Tests of bigbatch/inference/: bigbatch predict and what it reads as untrusted (video files)."""
