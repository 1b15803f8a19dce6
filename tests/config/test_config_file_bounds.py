"""A config file is read as a regular file within ``MAX_CONFIG_BYTES`` (``config/loading.py::read_config_bytes``):
the size is checked on the open file before any of it is read, so a huge YAML file (or a run directory's
``config.yaml`` of anyone's) costs nothing; a FIFO is never waited on."""

from __future__ import annotations

import os
import threading

import pytest

from bigbatch.config.loading import MAX_CONFIG_BYTES, read_yaml
from bigbatch.errors import UserError
from tests.helpers import HANG_GUARD_S, ROOT, run_main

pytestmark = pytest.mark.fast

DIGITS = ROOT / "bigbatch" / "configs" / "digits.yaml"


def test_a_yaml_config_past_the_bound_is_one_line_naming_it(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(DIGITS.read_bytes() + b"#" * MAX_CONFIG_BYTES + b"\n")  # valid YAML: a recipe, a long comment
    result = run_main("show", str(big))
    assert result.returncode == 2, result.stdout
    assert result.stderr == (f"error: config: {big} is {big.stat().st_size:,} bytes, more than a config may be "
                             f"({MAX_CONFIG_BYTES:,}); not read\n")
    at_the_bound = tmp_path / "at.yaml"
    text = DIGITS.read_bytes()
    at_the_bound.write_bytes(text + b"#" * (MAX_CONFIG_BYTES - len(text) - 1) + b"\n")
    assert read_yaml(at_the_bound)["name"] == "digits"


def test_a_sparse_file_of_gigabytes_is_refused_unread(tmp_path):
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as f:
        f.truncate(8 << 30)  # 8 GiB of holes: read whole, 8 GiB of memory
    with pytest.raises(UserError, match=r"^config: .*huge\.yaml is 8,589,934,592 bytes, more than a config may be"):
        read_yaml(huge)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    guard = threading.Timer(HANG_GUARD_S, lambda: open(fifo, "wb").close())  # hang guard: frees a waiting reader
    guard.start()
    try:
        with pytest.raises(UserError, match=r"is not a regular file; not read$"):
            read_yaml(fifo)
    finally:
        guard.cancel()
