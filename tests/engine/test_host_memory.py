"""Host memory a step frees is kept for the next micro-batch (``memory.keep_freed``, glibc): its pages are not
faulted in again; the RSS that ``memory.limit`` compares is the memory in use; training, the planner and the
profiler all set it, and ``memory.keep_freed=false`` leaves malloc alone.

The checks that count page faults or read the RSS run in a fresh process each: the settings last for the process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from bigbatch.config import load_config
from bigbatch.engine import host_memory
from bigbatch.engine.trainer import train
from tests.helpers import HANG_GUARD_S, ROOT

pytestmark = pytest.mark.skipif(host_memory.glibc() is None, reason="the switches are glibc's")

BLOCK_MIB, BLOCKS = 16, 4
"""A step's activations, small enough for the heap: allocated and written, held together, then all freed. They are
malloc's own blocks: torch's aligned ones leave small pieces beside them that decide, by chance of the layout,
whether even glibc's defaults keep them (a probe of the thresholds needs the same layout every time)."""


def in_fresh_process(body: str) -> dict:
    """Run ``body`` (which prints one JSON line last) in a new interpreter; its result."""
    script = f"BLOCK_MIB, BLOCKS = {BLOCK_MIB}, {BLOCKS}\n" + textwrap.dedent("""
        import ctypes, json, resource
        from bigbatch.engine import host_memory
        from bigbatch.telemetry.memory import rss_bytes

        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]

        def faults():
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

        def allocate():
            blocks = [libc.malloc(BLOCK_MIB << 20) for _ in range(BLOCKS)]
            for block in blocks:
                ctypes.memset(block, 1, BLOCK_MIB << 20)
            return blocks

        def free(blocks):
            for block in blocks:
                libc.free(block)

        def activations():
            free(allocate())
    """) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("keep", [False, True])
def test_a_steps_freed_memory_is_faulted_in_once_when_kept(keep):
    result = in_fresh_process(f"""
        applied = host_memory.keep_freed() if {keep} else False
        before = faults()
        activations()
        first = faults() - before
        before = faults()
        for _ in range(4):
            activations()
        print(json.dumps({{"applied": applied, "first": first, "faults": (faults() - before) / 4}}))
    """)
    # The first pass faults every page in, whatever the page size (or huge pages) of the machine: the control.
    assert result["first"] > 0
    assert result["applied"] == keep
    if keep:
        assert result["faults"] < result["first"] / 20, "the freed blocks served the next pass"
    else:
        assert result["faults"] > result["first"] / 2, "glibc's defaults trim the heap: every page is faulted in again"


def test_the_memory_limit_counts_the_memory_in_use_not_what_malloc_keeps():
    result = in_fresh_process("""
        from bigbatch.engine.hooks.memory import MemoryLimit
        from bigbatch.telemetry.memory import MemoryLimitExceeded

        host_memory.keep_freed()
        base = rss_bytes()
        activations()
        kept = rss_bytes() - base
        limit = MemoryLimit(base + kept // 2)
        limit.before_forward(None, 0)  # must not raise: the blocks are free
        released = rss_bytes() - base
        held = allocate()
        try:
            limit.before_forward(None, 0)
            over = False
        except MemoryLimitExceeded:
            over = True
        print(json.dumps({"kept": kept / 2**20, "released": released / 2**20, "over": over}))
    """)
    assert result["kept"] > BLOCK_MIB * BLOCKS * 0.9, "malloc kept the freed blocks: the RSS alone is over the limit"
    assert result["released"] < BLOCK_MIB * BLOCKS / 4
    assert result["over"], "blocks in use still count"


SETTINGS = ["steps=1", "batch=16", "subdivisions=2", "data.size=8", "model.width=4", "eval.every=1",
            "checkpoint.every=1", "log.tensorboard=false"]


@pytest.mark.parametrize("keep", [True, False])
def test_training_the_planner_and_the_profiler_keep_freed_memory_unless_told_not_to(tmp_path, monkeypatch, keep):
    from bigbatch.engine.planner import measure_in_this_process
    from bigbatch.engine.profile import profile
    from bigbatch.engine.step import TrainStep

    calls: list[str] = []
    monkeypatch.setattr(host_memory, "keep_freed", lambda: calls.append("kept") or True)
    cfg = load_config("digits", [*SETTINGS, f"memory.keep_freed={str(keep).lower()}"])
    train(cfg, tmp_path / "run")
    step = TrainStep.__call__
    planner_steps: list[int] = []
    monkeypatch.setattr(TrainStep, "__call__", lambda self, i, *rest: planner_steps.append(i) or step(self, i, *rest))
    measure_in_this_process(cfg, 8)
    monkeypatch.setattr(TrainStep, "__call__", step)
    profile(cfg, 1, tmp_path / "trace")
    assert calls == (["kept"] * 3 if keep else [])
    assert planner_steps == ([0, 1, 2, 3] if keep else [0, 1]), "kept memory settles over more passes"


def test_an_older_glibc_that_refuses_the_1_gib_mmap_threshold_still_gets_the_trim_threshold(monkeypatch):
    """glibc before 2.35 (the Jetson's JetPack 4 runs 2.27) refuses an mmap threshold over ``HEAP_MAX_SIZE / 2``,
    32 MiB: the trim threshold was then never set (``a and b``); now each is set on its own, the mmap threshold at
    the highest such a glibc takes."""

    class OldGlibc:
        def __init__(self):
            self.set = {}

        def mallopt(self, parameter, value):
            if parameter == host_memory.M_MMAP_THRESHOLD and value > 32 << 20:
                return 0  # do_set_mmap_threshold: "Forbid setting the threshold too high"
            self.set[parameter] = value
            return 1

    libc = OldGlibc()
    monkeypatch.setattr(host_memory, "glibc", lambda: libc)
    assert host_memory.keep_freed()
    assert libc.set == {host_memory.M_MMAP_THRESHOLD: 32 << 20, host_memory.M_TRIM_THRESHOLD: 1 << 30}
