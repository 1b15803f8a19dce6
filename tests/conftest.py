"""The suite's fixtures (its shared functions and constants are in tests/helpers.py), and the one setting that must
come before torch is imported."""

from __future__ import annotations

import os

import pytest

# One intra-op thread per process (a developer's own OMP_NUM_THREADS wins). ``make test`` already runs two tests at a
# time on a 2-core machine, and torch's OpenMP threads spin-wait for one another: with more threads than free cores a
# run is several times slower (the 60-step digits run of test_train_cli, beside other work: 25 s with one thread,
# 109 s with torch's default of two). Set before torch is imported: for the test process itself (its CLI runs in
# process, ``run_main``) and for every subprocess. pytest imports this file before any test module.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def own_written_records(tmp_path_factory):
    """The records of the files bigbatch writes (``floor/written.py``) go to the session's own folder, for the test
    process and every subprocess, never into the user's cache."""
    os.environ["BIGBATCH_CACHE_DIR"] = str(tmp_path_factory.mktemp("bigbatch-cache"))


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if training (any work past the checks) starts."""
    import bigbatch.engine.trainer as trainer

    def must_not_run(*args, **kwargs):
        raise AssertionError("training started: the mistake was not found before any work")

    monkeypatch.setattr(trainer, "train", must_not_run)
