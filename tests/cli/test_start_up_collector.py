"""Python's garbage collector through the command's start-up (``bigbatch/floor/collector.py``): no full collection
while torch and timm are imported, cyclic garbage still freed while held, the thresholds given back and the start-up's
objects frozen once the trainer starts its loop, and nothing of this in a process that did not ask for it.

Each test runs a fresh interpreter: the collector's state is the process's, and a frozen object is never freed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import HANG_GUARD_S, ROOT

COUNT_FULL = textwrap.dedent("""
    import gc, json, sys
    full = []
    gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2 and full.append(1))
""")


def run_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; what it printed last, as JSON."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("held", [False, True])
def test_importing_timm_sets_off_full_collections_unless_held(held):
    result = run_python(COUNT_FULL + textwrap.dedent(f"""
        from bigbatch.floor import collector
        if {held}:
            collector.hold()
        import timm
        print(json.dumps({{"full": len(full), "held": collector.held()}}))
    """))
    assert result["held"] is held
    if held:
        assert result["full"] == 0
    else:  # the control: Python's own thresholds collect everything several times over these imports
        assert result["full"] >= 2


@pytest.mark.fast
def test_cycles_are_still_freed_while_held():
    result = run_python(textwrap.dedent("""
        import gc, json, weakref
        from bigbatch.floor import collector
        collector.hold()

        class Node:
            pass

        first = Node()
        first.me = first
        alive = weakref.ref(first)
        del first
        for _ in range(300_000):  # three times the start-up's threshold of net allocations
            node = Node()
            node.me = node
        print(json.dumps({"freed": alive() is None, "threshold": gc.get_threshold()[0]}))
    """))
    assert result == {"freed": True, "threshold": 100_000}


@pytest.mark.fast
def test_settle_gives_the_thresholds_back_and_freezes_once():
    result = run_python(textwrap.dedent("""
        import gc, json
        from bigbatch.floor import collector
        before = gc.get_threshold()
        collector.settle()  # not held: nothing
        untouched = gc.get_freeze_count() == 0 and gc.get_threshold() == before
        collector.hold()
        collector.hold()  # a second hold keeps the first's thresholds to give back
        held = gc.get_threshold()
        collector.settle()
        frozen = gc.get_freeze_count()
        after = gc.get_threshold()
        collector.settle()  # once
        collector.thaw()
        print(json.dumps({"untouched": untouched, "held": list(held), "before": list(before), "after": list(after),
                          "frozen": frozen, "thawed": gc.get_freeze_count()}))
    """))
    assert result["untouched"]
    assert result["held"] == [100_000, *result["before"][1:]]
    assert result["after"] == result["before"]
    assert result["frozen"] > 1000 and result["thawed"] == 0


def test_the_trainer_settles_a_held_start_up_and_only_then(tmp_path):
    """Through the CLI's ``main`` as the entry point calls it: held through the imports, settled (frozen, thresholds
    back) by the time the run has ended; the same ``main`` without the hold leaves the collector alone."""
    settings = ["batch=64", "data.size=8", "model.width=4", "log.tensorboard=false", "eval.every=100",
                "checkpoint.every=4", "steps=2"]
    code = COUNT_FULL + textwrap.dedent(f"""
        from bigbatch.floor import collector
        if sys.argv[1] == "held":
            collector.hold()
        before = gc.get_threshold()
        from bigbatch.cli import main
        assert main(["train", "digits", "--out", sys.argv[2], "--set", *{settings!r}]) == 0
        print(json.dumps({{"held": collector.held(), "frozen": gc.get_freeze_count(),
                          "threshold": gc.get_threshold()[0], "before": before[0]}}))
    """)
    results = {}
    for mode in ("held", "free"):
        done = subprocess.run([sys.executable, "-c", code, mode, str(tmp_path / mode)], cwd=ROOT, capture_output=True,
                              text=True, timeout=HANG_GUARD_S)
        assert done.returncode == 0, done.stderr
        results[mode] = json.loads(done.stdout.splitlines()[-1])
    held, free = results["held"], results["free"]
    assert held["before"] == 100_000 and not held["held"] and held["frozen"] > 10_000
    assert held["threshold"] < 100_000  # Python's own, given back
    assert free["frozen"] == 0 and free["threshold"] == free["before"] < 100_000
