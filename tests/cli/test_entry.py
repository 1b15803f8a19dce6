"""The exit of the ``bigbatch`` command (``bigbatch/entry.py``, ``floor/process_exit.py``): without the interpreter's
teardown, but after the threads, the ``atexit`` callbacks and the output streams, Python's and the C library's; the
usual exit where a tracer, a profiler, a native CUDA tool or development mode watches.

Each test runs a fresh interpreter: what is tested is how that process ends. The teardown's mark is a cycle of
objects whose ``__del__`` writes a file: only the interpreter's finalization collects it (the control test shows that
it does); the script also marks a call of ``os._exit``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import HANG_GUARD_S, ROOT, bigbatch_command, run_cli, write_photo_folder

SCRIPT = textwrap.dedent("""
    import atexit, os, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    marks = Path(sys.argv[1])
    leave = os._exit
    os._exit = lambda code: ((marks / "os._exit").write_text("ran"), leave(code))

    class Cycle:  # only the interpreter's finalization collects it, and only then is __del__ called
        def __init__(self, path):
            self.path = path

        def __del__(self, write=os.open, close=os.close, flags=os.O_WRONLY | os.O_CREAT):
            close(write(self.path, flags))  # its own names: the modules' and builtins' may be gone by then

    cycle = Cycle(str(marks / "teardown"))
    cycle.me = cycle
    atexit.register(lambda: (marks / "atexit").write_text("ran"))

    def late():  # not a daemon: the exit must wait for it
        threading.Event().wait(0.2)
        (marks / "thread").write_text("ran")

    threading.Thread(target=late).start()
    pool = ThreadPoolExecutor(1)  # its worker idles, never shut down: threading's exit hook tells it to stop
    pool.submit(int).result()
    {setup}
    for row in range(2000):  # more than a pipe's buffer of 8 KiB: written only as the exit flushes stdout
        print(f"row {{row}}")
    import ctypes
    ctypes.CDLL(None).printf(b"from C\\n")  # through the C library's buffer: flushed by its exit, or by ours
    {entry}
""")


def block_buffered() -> dict[str, str]:
    """The environment, with stdout block-buffered on a pipe, as Python has it by default."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}


EXIT_NOW = "from bigbatch.floor.process_exit import exit_now; exit_now({code})"
ROWS = [f"row {row}" for row in range(2000)] + ["from C"]


def run_script(tmp_path: Path, *python_flags: str, setup: str = "", entry: str = EXIT_NOW.format(code=0),
               env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(setup=setup, entry=entry), encoding="utf-8")
    done = subprocess.run([sys.executable, *python_flags, str(script), str(marks)], cwd=ROOT,
                          env={**block_buffered(), **(env or {})},
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    return done, {path.name for path in marks.iterdir()}


@pytest.mark.fast
def test_the_interpreter_s_own_exit_tears_the_cycle_down(tmp_path):
    """The control: the usual ``sys.exit`` collects the cycle, so its absence below means the teardown was skipped."""
    done, marks = run_script(tmp_path, entry="sys.exit(0)")
    assert done.returncode == 0, done.stderr
    assert marks == {"teardown", "atexit", "thread"}
    assert done.stdout.splitlines() == ROWS


@pytest.mark.fast
def test_the_entry_point_skips_the_teardown_but_not_the_threads_atexit_or_output(tmp_path):
    done, marks = run_script(tmp_path)
    assert done.returncode == 0, done.stderr
    assert marks == {"atexit", "thread", "os._exit"}
    assert done.stdout.splitlines() == ROWS  # Python's buffer, then the C library's


@pytest.mark.fast
def test_the_status_given_is_the_status_left(tmp_path):
    done, marks = run_script(tmp_path, entry=EXIT_NOW.format(code=3))
    assert done.returncode == 3 and "os._exit" in marks


@pytest.mark.fast
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device whose writes fail: disk full)")
def test_output_that_cannot_be_written_is_one_error_line_and_status_120(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("print('lost')\n" + EXIT_NOW.format(code=0) + "\n", encoding="utf-8")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=block_buffered(), stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 120
    assert done.stderr.startswith("error: writing <stdout>: ") and "No space left" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_the_command_s_output_and_status_come_through_the_entry_point():
    done = run_cli("schedule", "digits")  # python -m bigbatch, its stdout a pipe
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("141 steps, global batch 256")  # digits' schedule: every 3rd step, then the last
    assert lines[-1].split()[0] == "140"


@pytest.mark.fast
@pytest.mark.parametrize("watcher", ["dev-mode", "tracer", "profiler", "cuda-tool"])
def test_a_watched_process_keeps_the_interpreter_s_exit(tmp_path, watcher):
    flags = ("-X", "dev") if watcher == "dev-mode" else ()
    setup = {"tracer": "sys.settrace(lambda *a: None)",
             "profiler": "import cProfile; cProfile.Profile().enable()"}.get(watcher, "")
    env = {"CUDA_INJECTION64_PATH": str(tmp_path / "tool.so")} if watcher == "cuda-tool" else None
    done, marks = run_script(tmp_path, *flags, setup=setup, env=env)
    assert done.returncode == 0, done.stderr
    assert {"atexit", "thread"} <= marks and "os._exit" not in marks


def test_a_command_that_leaves_the_decoding_threads_idle_ends(tmp_path):
    """At 0 workers the region decode's pool of sample threads (``encoded_images.sample_threads``) outlives the
    command, its workers idle and not daemons: the exit must tell them to stop before it waits for them."""
    folder = write_photo_folder(tmp_path / "photos")
    done = run_cli("data", "bench", "digits", "--images", "24", "--set", "data.name=folder", f"data.path={folder}",
                   "data.size=64", "data.preprocessing=standard", "data.workers=0", "batch=8", "subdivisions=1")
    assert done.returncode == 0, done.stderr
    assert "images/s" in done.stdout


def test_an_error_s_status_and_line_come_through(tmp_path):
    done = run_cli("train", "digits", "--out", str(tmp_path / "run"), "--set", "epochs=-1")
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "epochs" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.fast
def test_python_m_bigbatch_runs_the_command_once():
    """``__main__`` runs the command under its guard only: a module that imports it (a ``spawn`` child imports the
    main module as ``__mp_main__``) does not run it again."""
    done = subprocess.run([sys.executable, "-c", "import runpy; runpy.run_module('bigbatch', run_name='__mp_main__')"],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert bigbatch_command("x")[1:3] == ["-m", "bigbatch"]


@pytest.mark.fast
def test_a_broken_pipe_that_is_not_stdout_s_keeps_its_traceback(tmp_path):
    """Only a reader of ``stdout`` that left is status 1 without a word: a broken pipe of the command's own (a
    connection to a child, a FIFO) is an error like any other, with its traceback."""
    script = tmp_path / "script.py"
    script.write_text("import bigbatch.cli\n"
                      "def main():\n    raise BrokenPipeError(32, 'a pipe of the command')\n"
                      "bigbatch.cli.main = main\n"
                      "from bigbatch.entry import run\nrun()\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "BrokenPipeError: [Errno 32] a pipe of the command" in done.stderr


@pytest.mark.parametrize("buffering", ["block", "line"])
def test_a_reader_that_left_gives_status_1_without_a_traceback(buffering):
    """``bigbatch schedule digits | head -0``: the pipe is closed before the command writes. Block-buffered, the
    write that fails is the exit's flush; unbuffered, a ``print`` inside the command."""
    env = {**block_buffered(), **({"PYTHONUNBUFFERED": "1"} if buffering == "line" else {})}
    process = subprocess.Popen(bigbatch_command("schedule", "digits"), cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # before anything is written: every write fails
    stderr = process.communicate(timeout=HANG_GUARD_S)[1]
    assert process.returncode == 1
    assert stderr == ""
