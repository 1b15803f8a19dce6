"""What the tests share: the project's paths, ways to run the CLI (in a fresh process or in this one), spawned
process groups, the small settings and files that several test modules train with, and their checks.

Test modules import from here, never from one another (tests/project/test_suite_layout.py checks it);
``conftest.py`` holds the fixtures only."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bigbatch.darknet.cfg import Yolo
from bigbatch.engine.hooks import Hook

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
"""Small files the tests read: reference files (tests/fixtures/darknet/README.md says where they come from) and a run
directory written by an earlier version (run-format1)."""
DARKNET_DATA = FIXTURES / "darknet"
"""Darknet's own yolov3.cfg, yolov3-tiny.cfg, coco.names and coco.data, verbatim (tests/fixtures/darknet/README.md)."""

HANG_GUARD_S = 900
"""How long a test's subprocess, group of spawned workers or Gloo collective may take before it is taken to hang.

A hang guard, not a speed expectation: no test may fail because the machine is slow or busy. The slowest single
process of the suite, the 150-step detection run of test_detection_train, took 59 s on the project's 2-core machine
beside other work (2026-12-01); 15 minutes is fifteen times that. A whole test is guarded by pytest-timeout's
``timeout`` in pyproject.toml: 30 minutes, as a test may run several such processes one after the other."""


def bigbatch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "bigbatch", *args]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = HANG_GUARD_S) -> subprocess.CompletedProcess:
    """Run the real ``bigbatch`` CLI in a fresh process (``timeout``: a hang guard, see ``HANG_GUARD_S``)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(bigbatch_command(*args), cwd=cwd or ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def run_main(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``run_cli`` in this process: ``bigbatch.cli.main(args)`` with its stdout and stderr captured, in ``cwd``
    (default: the project's root) and without ``WORLD_SIZE`` or ``RANK`` in the environment, all restored after.

    For tests of what a command does, where the process itself is not what is tested: it saves a Python start and
    torch's import (seconds each on the 2-core machine). A test keeps ``run_cli`` where the real process matters: a
    signal, torchrun, the ``python -m bigbatch`` entry point and its exit status, an environment variable read
    before torch is imported, or a fresh interpreter (global torch state, a DataLoader worker's own stderr).
    Only what Python writes to ``sys.stdout``/``sys.stderr`` is captured (tqdm draws only on a terminal); an
    exception that ``main`` lets through is raised here, with its traceback, rather than turned into exit status 1.
    """
    from bigbatch.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    removed = {key: os.environ.pop(key) for key in ("WORLD_SIZE", "RANK") if key in os.environ}
    previous = os.getcwd()
    os.chdir(cwd or ROOT)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                returncode = main(list(args))
            except SystemExit as e:  # argparse's usage errors, as the process would exit
                if e.code is None or isinstance(e.code, int):
                    returncode = e.code
                else:
                    print(e.code, file=sys.stderr)
                    returncode = 1
    finally:
        os.chdir(previous)
        os.environ.update(removed)
    return subprocess.CompletedProcess(bigbatch_command(*args), returncode or 0, stdout.getvalue(), stderr.getvalue())


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str,
                     make: Callable[[Path], subprocess.CompletedProcess]) -> tuple[Path, subprocess.CompletedProcess]:
    """``make(folder)`` run once for the whole session, however many xdist workers ask: the folder it wrote and
    the command's result (its exit status, stdout and stderr, kept beside the folder for the workers that come
    later).

    A module-scoped fixture runs once per worker that takes one of its tests, and ``--dist worksteal`` may hand a
    module's tests to both workers: the 100-step detection run then ran twice (32 and 27 s). Here the first worker
    makes it under a file lock in the session's shared temporary folder, which pytest removes when the session
    passes; the others wait on the lock and read it. Without xdist, the folder is this session's own."""
    from filelock import FileLock

    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    root = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.getbasetemp()
    folder, made = root / name, root / f"{name}.result.json"
    with FileLock(str(root / f"{name}.lock")):
        if not made.is_file():
            if folder.exists():
                pytest.fail(f"{folder}: an earlier worker's making of it failed (its own error says why)")
            folder.mkdir()
            result = make(folder)
            made.write_text(json.dumps({"args": [str(a) for a in result.args], "returncode": result.returncode,
                                        "stdout": result.stdout, "stderr": result.stderr}))
        kept = json.loads(made.read_text())
    return folder, subprocess.CompletedProcess(kept["args"], kept["returncode"], kept["stdout"], kept["stderr"])


def free_port() -> int:
    """A port free now. Only for what must be told a port before anything binds it (several torchrun agents
    meeting at one address): another process may take it before it is bound again. Where this process can hold the
    port itself, it should (``run_spawned``'s store, torchrun's ``--standalone``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_gloo(rank: int, world: int, port: int) -> None:
    """In a ``run_spawned`` worker: join the Gloo group of ``world`` processes through the store ``run_spawned``
    holds on ``port``."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=HANG_GUARD_S))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=HANG_GUARD_S))


def run_spawned(worker: Callable[[int, int, str], None], world: int, out_dir: Path,
                timeout_s: float = HANG_GUARD_S) -> list:
    """Run ``worker(rank, port, out_dir)`` in ``world`` spawned processes (they join a Gloo group through the store
    this process holds on ``port``: ``join_gloo``) and return what each wrote to ``out_dir/rank<r>.pt``; fail the
    test if they do not finish within ``timeout_s`` (a hang guard). Workers still running when this returns or
    raises (a failed rank, pytest-timeout) are killed. The store's port is the one the kernel gave it, bound from
    the start, so no other process can take it in between."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=HANG_GUARD_S))
    ctx = mp.start_processes(worker, args=(store.port, str(out_dir)), nprocs=world, join=False,
                             start_method="spawn")
    try:
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"distributed workers did not finish within {timeout_s} s (hung?)")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]


def count_host_transfers(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the Python-level ways a tensor's value reaches the host (each one a device sync on CUDA)."""
    import torch

    calls = {"n": 0}
    for method in ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy"):
        original = getattr(torch.Tensor, method)

        def counted(self, *args, _original=original, **kwargs):
            calls["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counted)
    return calls


def clean_env() -> dict[str, str]:
    """This process's environment for a launcher subprocess: one thread, unbuffered, and no torchrun variables."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


# --- digits runs under torchrun, and their weights ------------------------------------------------------------------

COMMON = ["batch=64", "steps=3", "data.size=16", "model.width=8", "log.tensorboard=false", "eval.batch=50",
          "schedule.warmup=[]"]
"""The short digits run that the layout tests (one process against several) train."""


def torchrun(out, *overrides: str, processes: int = 2, config: str = "digits",
             common: Sequence[str] = COMMON) -> subprocess.CompletedProcess:
    """``bigbatch train <config>`` (default: digits with ``COMMON``) with ``common`` and ``overrides`` under a real
    ``torchrun`` of ``processes``, on the CPU."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), *standalone(),
               "-m", "bigbatch", "train", config, "--out", str(out), "--set", *common, *overrides]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)


def standalone() -> list[str]:
    """torchrun's arguments for one agent on this machine: ``--standalone`` (its store on a port the kernel gives
    it, held from the start; the launch users type) with the hang guard's timeouts (``rendezvous_conf``)."""
    return ["--standalone", "--rdzv-conf", rendezvous_conf()]


# --- several torchrun agents on this machine, as on several machines -------------------------------------------------

def rendezvous_conf() -> str:
    """torchrun's ``--rdzv-conf`` for the c10d rendezvous of agents on one busy machine: its timeouts are the hang guard
    (``HANG_GUARD_S``), not torch's defaults (a 60 s read timeout on the store, 600 s to join, a node taken for dead
    after 3 missed 5 s heartbeats), which a starved process can overrun. The last call (the wait for more agents once
    the minimum has joined) is left as it is: it matters only where ``--nnodes`` is a range."""
    return (f"join_timeout={HANG_GUARD_S},read_timeout={HANG_GUARD_S},close_timeout={HANG_GUARD_S},"
            f"keep_alive_max_attempt={HANG_GUARD_S // 5}")


ELASTIC_HEARTBEAT_S = 2
ELASTIC_LOST_AFTER_HEARTBEATS = 10
ELASTIC_LAST_CALL_S = 10


def elastic_rendezvous_conf() -> str:
    """``--rdzv-conf`` of an elastic test's agents (``--nnodes 1:2``), whose store a process of the test hosts
    (``is_host=false``: no agent hosts it, so that either may be lost). Joining and reading keep the hang guard of
    :func:`rendezvous_conf`. Two waits are the scenario, not guards, and no outcome depends on a busy machine
    keeping them:

    - an agent silent for ``ELASTIC_HEARTBEAT_S x ELASTIC_LOST_AFTER_HEARTBEATS`` (20 s; torch's default 5 s x 3) is
      taken for lost. An agent is an idle process with a heartbeat thread: on a starved machine it may miss
      beats, and a live agent taken for lost only joins the next round again;
    - once one agent has joined, the rendezvous waits ``ELASTIC_LAST_CALL_S`` (torch's default 30 s) for another
      before it starts with one. An agent later than that joins as a node added: the workers restart with two."""
    return (f"is_host=false,join_timeout={HANG_GUARD_S},read_timeout={HANG_GUARD_S},close_timeout={HANG_GUARD_S},"
            f"keep_alive_interval={ELASTIC_HEARTBEAT_S},keep_alive_max_attempt={ELASTIC_LOST_AFTER_HEARTBEATS},"
            f"last_call_timeout={ELASTIC_LAST_CALL_S}")


def agents_env(**extra: str) -> dict[str, str]:
    """``clean_env()`` for a torchrun agent, without the variables that would change what the agents share (the
    store: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``; the BN all-reduce: ``BIGBATCH_HOST_ALL_REDUCE``), plus ``extra``."""
    env = clean_env()
    for key in ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "BIGBATCH_HOST_ALL_REDUCE", "GROUP_RANK", "LOCAL_WORLD_SIZE",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(key, None)
    return {**env, **extra}


def processes_naming(text: str) -> list[int]:
    """The pids of the processes whose command line holds ``text`` (a test's own tmp_path: its launchers, their workers
    and whatever those forked)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def listening_ports() -> set[int]:
    """The TCP ports (IPv4 and IPv6) on which a socket of this user is in LISTEN, from /proc/net/tcp and tcp6: another
    user's server that happens to take a port the test freed is not the test's."""
    ports, uid = set(), os.getuid()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[7]) == uid:  # TCP_LISTEN, the socket's owner
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@contextlib.contextmanager
def launched(commands: Sequence[Sequence[str]], logs: Path, env: dict[str, str], owner: str):
    """Start each command (a torchrun agent) in a session of its own, its stdout and stderr in ``logs/agent<i>.out`` and
    ``.err``; yield the ``Popen``s. On the way out, however the test went: each agent still running is killed with its
    process group (SIGKILL, by the agent's pid, the group's id), and then every process whose command line names
    ``owner`` (the test's tmp_path: torchrun starts each worker in a session of its own, which outlives its agent) is
    killed by its pid; all are waited for."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for i, command in enumerate(commands):
            with open(logs / f"agent{i}.out", "w") as out, open(logs / f"agent{i}.err", "w") as err:
                procs.append(subprocess.Popen(list(command), cwd=ROOT, env=env, stdout=out, stderr=err,
                                              start_new_session=True))
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:  # not reaped yet: its pid is still the group's
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait()
        for pid in processes_naming(owner):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + HANG_GUARD_S
        while processes_naming(owner) and time.monotonic() < deadline:  # killed, until the kernel has them gone
            time.sleep(0.05)


def wait_for_agents(procs: Sequence[subprocess.Popen], timeout: float = HANG_GUARD_S) -> None:
    """Until every agent has ended, or one has failed: the others may then wait for its workers until torch's own
    timeouts (30 minutes), so the test goes on at once, and ``launched`` kills them on its way out. Fails the test
    past ``timeout`` (a hang guard)."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [proc.poll() for proc in procs]
        if None not in codes or any(code not in (None, 0) for code in codes):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"torchrun agents still running after {timeout} s (hung?): exit codes so far {codes}")
        time.sleep(0.1)


def train_records(out) -> list[dict]:
    """The training records of the run directory ``out``'s ``metrics.jsonl`` (no evaluations, no events)."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "lr" in r]


def weights(out) -> dict[str, torch.Tensor]:
    """The model weights of the run directory ``out``'s last checkpoint."""
    return torch.load(out / "checkpoints" / "last.pt", weights_only=True)["model"]


def assert_same_weights(a, b, atol: float = 1e-4) -> None:
    """Every floating-point weight of ``a`` equals ``b``'s within ``atol`` (BN running statistics left out)."""
    for key, value in a.items():
        if value.is_floating_point() and not key.endswith(("running_mean", "running_var")):
            torch.testing.assert_close(b[key], value, rtol=0, atol=atol, msg=key)


# --- a small run directory, and one held by another process ---------------------------------------------------------

TINY = ["batch=32", "subdivisions=2", "data.size=16", "model.width=8", "log.tensorboard=false", "eval.every=100",
        "memory.interval=60"]
"""Settings of a digits run small enough to train in a test that is about the CLI's checks."""

HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from bigbatch.engine.run_dir import hold_run_dir
    with hold_run_dir(Path(sys.argv[1])):
        print("held", flush=True)
        sys.stdin.read()  # until the test closes stdin or kills this process
""")
"""A Python program that holds the run directory ``argv[1]`` (as a training would) until its stdin closes."""


# --- a folder of real photographs -----------------------------------------------------------------------------------

PHOTOS = ("china.jpg", "flower.jpg")
"""The two photographs (427 x 640 JPEG) that ship with scikit-learn: one class each, plus a third class of
crops of both turned upside down."""


def write_shapes_set(root: Path, images: int, seed: int = 5) -> Path:
    """``bigbatch data shapes --out root --images N --seed S`` (the COCO layout), checked to succeed."""
    result = run_main("data", "shapes", "--out", str(root), "--images", str(images), "--seed", str(seed))
    assert result.returncode == 0, result.stderr
    return root


def write_photo_folder(root: Path, train: int = 8, val: int = 3, seed: int = 0) -> Path:
    """``root/{train,val}/{china,flower,upside_down}/`` with JPEG crops (and one PNG) of the sample photos."""
    from sklearn.datasets import load_sample_image

    rng = np.random.default_rng(seed)
    photos = [load_sample_image(name) for name in PHOTOS]
    for split, count in (("train", train), ("val", val)):
        for name in ("china", "flower", "upside_down"):
            (root / split / name).mkdir(parents=True)
        for i in range(count):
            for label, photo in enumerate(photos):
                h, w = int(rng.integers(60, 200)), int(rng.integers(60, 200))
                top, left = int(rng.integers(0, 427 - h)), int(rng.integers(0, 640 - w))
                crop = Image.fromarray(photo[top:top + h, left:left + w])
                crop.save(root / split / PHOTOS[label].removesuffix(".jpg") / f"{i:03d}.jpg", quality=90)
                flipped = crop.transpose(Image.Transpose.ROTATE_180)
                suffix = "png" if i == 0 else "JPEG"  # a PNG, and ImageNet's upper-case suffix
                flipped.save(root / split / "upside_down" / f"{label}{i:03d}.{suffix}",
                             format="PNG" if suffix == "png" else "JPEG")
    return root


class StopAfter(Hook):
    """Interrupts the run after the given step (the checkpoint of an earlier step is on disk)."""

    stage = "write"

    def __init__(self, step: int) -> None:
        self.step = step

    def after_step(self, run) -> None:
        if run.progress.step == self.step:
            raise KeyboardInterrupt


# --- Darknet networks written by hand -------------------------------------------------------------------------------


def net_header(width: int, height: int, channels: int) -> str:
    """A Darknet cfg's ``[net]`` section for one image of ``width`` x ``height`` x ``channels``."""
    return f"[net]\nbatch=1\nwidth={width}\nheight={height}\nchannels={channels}\n"


SMALL = net_header(5, 5, 2) + """
[convolutional]
batch_normalize=1
filters=3
size=3
stride=1
pad=1
activation=leaky

[convolutional]
filters=2
size=1
stride=1
groups=1
activation=linear
"""
"""A two-convolution Darknet network (BN and leaky, then a linear one with a bias): the .weights layout tests' own."""


# ----------------------------------------------------------------------------- Darknet's [yolo] deltas: the cases
"""The cases on which bigbatch's Darknet-dialect YOLO loss is compared with Darknet's own ``l.delta``: shared by
``benchmarks/darknet_oracle/yolo_deltas.py`` (which runs Darknet on them and writes
``tests/fixtures/darknet/yolo_delta/<case>.npz``) and ``tests/darknet/test_yolo_dialects.py`` (which reads those files).

A case is a stock cfg of one fork, at an input size and batch, with ``[yolo]`` keys optionally overridden (to reach
keys no small stock cfg combines), the truths of each image, and the inputs of each ``[yolo]`` layer by the INPUT
RULE below.

INPUT RULE: value ``k`` (0-based over the layer's ``(N, A, 5 + C, H, W)`` input, C order) of the ``[yolo]`` layer
at index ``i`` is ``u(k + 7919 i + salt)`` mapped per channel: box x, y, w, h and objectness ``6u - 3``; classes
``6u - 3`` in cells whose ``cell_low`` bit is 0, else ``1.5u - 3`` (every class probability under 0.25: AlexeyAB's
``compare_yolo_class`` fails there). With ``new_coords`` (the inputs are already logistic outputs) ``u`` and
``0.2u`` instead. ``u(k) = (hash32(k) >> 8) / 2**24`` with the oracle's hash32 (benchmarks/darknet_oracle/README.md).
Then the PLANTED predictions of :func:`_plant_predictions` replace the box inputs of a few slots.
"""

STOCK_CFGS = "tests/fixtures/darknet/stock"

# truths per image: (x, y, w, h, class), fractions of the input, in the order Darknet sees them
YOLO_DELTA_TRUTHS = (
    (  # two truths on one cell and (nearly) one shape: the same anchor twice; one more of another class
        (0.30, 0.30, 0.20, 0.25, 3), (0.32, 0.31, 0.21, 0.24, 7), (0.70, 0.62, 0.45, 0.30, 3),
        (0.12, 0.85, 0.06, 0.08, 0),
    ),
    (  # small and large, near the borders
        (0.97, 0.04, 0.05, 0.07, 79), (0.50, 0.50, 0.90, 0.85, 12), (0.05, 0.55, 0.10, 0.40, 1),
        (0.60, 0.20, 0.15, 0.15, 12), (0.61, 0.21, 0.15, 0.16, 12),
    ),
    (  # one truth only, one image with none
        (0.44, 0.66, 0.33, 0.22, 5),
    ),
    (),
)


@dataclass(frozen=True)
class YoloDeltaCase:
    name: str
    fork: str  # alexeyab | pjreddie
    cfg: str  # under STOCK_CFGS/<fork>/
    size: int
    keys: dict[str, str] = field(default_factory=dict)  # [yolo] keys set in every [yolo] section
    salt: int = 0

    @property
    def images(self) -> int:
        return len(YOLO_DELTA_TRUTHS)


YOLO_DELTA_COUNTERS = ", ".join(str(100 + 37 * c % 900) for c in range(80))
YOLO_DELTA_CASES = (
    YoloDeltaCase("alexeyab-yolov3-tiny", "alexeyab", "yolov3-tiny.cfg", 128),
    YoloDeltaCase("alexeyab-yolov4-tiny", "alexeyab", "yolov4-tiny.cfg", 128, salt=11),
    YoloDeltaCase("alexeyab-yolov4-csp", "alexeyab", "yolov4-csp.cfg", 128, salt=23),
    YoloDeltaCase("alexeyab-yolov4-csp-mse", "alexeyab", "yolov4-csp.cfg", 128, {"iou_loss": "mse"}, salt=29),
    YoloDeltaCase("alexeyab-yolov3-tiny-giou-keys", "alexeyab", "yolov3-tiny.cfg", 128, {
        "iou_loss": "giou", "iou_normalizer": "0.5", "iou_thresh": "0.3", "iou_thresh_kind": "giou",
        "label_smooth_eps": "0.1", "counters_per_class": YOLO_DELTA_COUNTERS, "max_delta": "3", "truth_thresh": "0.6",
        "obj_normalizer": "0.7", "scale_x_y": "1.1"}, salt=31),
    YoloDeltaCase("alexeyab-yolov3-tiny-focal-diou", "alexeyab", "yolov3-tiny.cfg", 128, {
        "iou_loss": "diou", "iou_normalizer": "0.25", "focal_loss": "1", "objectness_smooth": "1",
        "iou_thresh": "0.25", "ignore_thresh": "0.4"}, salt=37),
    YoloDeltaCase("alexeyab-yolov3-tiny-iou", "alexeyab", "yolov3-tiny.cfg", 128,
                  {"iou_loss": "iou", "truth_thresh": "0.5"}, salt=41),
    YoloDeltaCase("pjreddie-yolov3-tiny", "pjreddie", "yolov3-tiny.cfg", 128, salt=43),
    YoloDeltaCase("pjreddie-yolov3-tiny-truth-thresh", "pjreddie", "yolov3-tiny.cfg", 128, {"truth_thresh": "0.6"},
                  salt=47),
)


def oracle_hash32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.uint32)
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def oracle_uniform(k: np.ndarray) -> np.ndarray:
    return (oracle_hash32(k) >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def yolo_delta_input(case: YoloDeltaCase, index: int, spec: Yolo, height: int, width: int) -> np.ndarray:
    """The INPUT RULE: the ``(N, A * (5 + C), H, W)`` float32 input of the ``[yolo]`` layer ``spec`` at ``index``."""
    shape = (case.images, len(spec.mask), 5 + spec.classes, height, width)
    k = np.arange(int(np.prod(shape)), dtype=np.uint64) + np.uint64(7919 * index + case.salt)
    u = oracle_uniform((k % np.uint64(2**32)).astype(np.uint32)).reshape(shape)
    cell = np.arange(shape[0] * shape[1] * height * width, dtype=np.uint32).reshape(shape[0], shape[1], 1, height,
                                                                                     width)
    low = (oracle_hash32(cell + np.uint32(case.salt)) & np.uint32(1)).astype(bool)
    if spec.new_coords:
        x = u.copy()
        x[:, :, 5:] = np.where(low, np.float32(0.2) * u[:, :, 5:], u[:, :, 5:])
    else:
        x = np.float32(6) * u - np.float32(3)
        x[:, :, 5:] = np.where(low, np.float32(1.5) * u[:, :, 5:] - np.float32(3), x[:, :, 5:])
    _plant_predictions(x, case, spec, height, width)
    return x.astype(np.float32).reshape(shape[0], -1, height, width)


def _plant_predictions(x: np.ndarray, case: YoloDeltaCase, spec: Yolo, height: int, width: int) -> None:
    """PLANTED predictions: for every other truth (the 1st, 3rd, ...) of an image, the anchor slot ``t % A`` of the
    truth's cell predicts the truth's box, moved by 3 % of its size and 10 % larger (IoU about 0.8: above
    ``ignore_thresh``, and above ``truth_thresh`` where a case sets it under 0.8)."""
    s = spec.scale_x_y
    for b, truths in enumerate(YOLO_DELTA_TRUTHS):
        for t, (bx, by, bw, bh, _) in enumerate(truths):
            if t % 2:
                continue
            a = t % len(spec.mask)
            i, j = min(int(bx * width), width - 1), min(int(by * height), height - 1)
            aw, ah = spec.anchors[spec.mask[a]]
            fx = min(max(bx * width - i + 0.03 * bw * width, 0.02), 0.98)
            fy = min(max(by * height - j + 0.03 * bh * height, 0.02), 0.98)
            w, h = 1.1 * bw * case.size / aw, 1.1 * bh * case.size / ah
            if spec.new_coords:
                values = [(fx + (s - 1) / 2) / s, (fy + (s - 1) / 2) / s, np.sqrt(w / 4), np.sqrt(h / 4)]
            else:
                values = [np.log(v / (1 - v)) for v in ((fx + (s - 1) / 2) / s, (fy + (s - 1) / 2) / s)]
                values += [np.log(w), np.log(h)]
            x[b, a, :4, j, i] = np.float32(values)


def cfg_with_keys(text: str, size: int, keys: dict[str, str], batch: int = 1) -> str:
    """``text`` with the ``[net]`` width/height set to ``size``, its batch to ``batch`` (subdivisions 1: Darknet
    allocates its layers for batch / subdivisions images) and ``keys`` set in every ``[yolo]`` section (replacing
    a key given there, else added at the section's end)."""
    out: list[str] = []
    section = ""
    pending: dict[str, str] = {}

    def close() -> None:
        if section == "yolo":
            out.extend(f"{k}={v}" for k, v in pending.items())

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            close()
            section = stripped.strip("[]").strip().lower()
            pending = dict(keys)
            out.append(line)
            continue
        key = stripped.split("=", 1)[0].strip() if "=" in stripped and not stripped.startswith("#") else ""
        if section == "net" and key in ("width", "height", "batch", "subdivisions"):
            out.append(f"{key}={ {'batch': batch, 'subdivisions': 1}.get(key, size)}")
        elif section == "yolo" and key in pending:
            out.append(f"{key}={pending.pop(key)}")
        else:
            out.append(line)
    close()
    return "\n".join(out) + "\n"


# --- a run paused at a known step, to be killed there ----------------------------------------------------------------

PAUSE_AT = 12  # the checkpoint before it is step 10: steps 11 and 12 are logged past it


def pausing_bigbatch(at: int) -> str:
    """``bigbatch`` that, once the record of step ``at`` is in metrics.jsonl, says "paused" and waits to be killed.
    Killed there, rather than at whatever step a polling test happens to see, the run is cut at the same point
    however fast or busy the machine (a poller starved of the CPU could let the run finish first)."""
    return f"""
import sys, time
from bigbatch.cli import main
from bigbatch.engine.hooks import Hook
from bigbatch.registry import HOOKS

class PauseAfterRecord(Hook):  # after the built-in hooks: the step's record is written
    stage = "write"

    def after_step(self, run):
        if run.progress.step == {at}:
            run.state.finish_writes()  # killed with the checkpoints saved so far on disk
            print("paused", flush=True)
            while True:
                time.sleep(60)

HOOKS.register("pause", lambda run: PauseAfterRecord())
sys.exit(main())
"""


PAUSING_BIGBATCH = pausing_bigbatch(PAUSE_AT)


def train_and_kill(args: list[str], run_dir: Path, at: int, stderr_path: Path) -> None:
    """``bigbatch train *args --out run_dir`` in a fresh process, killed (SIGKILL) once step ``at`` is recorded: a
    crash at a known step, its last checkpoint the one before it."""
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", pausing_bigbatch(at), "train", *args, "--out", str(run_dir)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert "paused" in (line.strip() for line in proc.stdout), stderr_path.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=HANG_GUARD_S)
        proc.stdout.close()


VIDEO_WIDTH, VIDEO_HEIGHT = 64, 48


def colour(i: int) -> tuple[int, int, int]:
    """Video frame ``i``'s colour: red rises and blue falls with ``i``, so both the order and the channel order show."""
    return 20 + 18 * i, 128, 230 - 18 * i


def write_video(path, colours, fps: int = 10) -> None:
    """A video of one solid colour per frame (MPEG-4 Part 2: FFmpeg's own encoder, in every PyAV build); skips the
    test where PyAV is not installed."""
    av = pytest.importorskip("av")
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = VIDEO_WIDTH, VIDEO_HEIGHT, "yuv420p"
        stream.options = {"qscale": "2"}
        for rgb in colours:
            array = np.full((VIDEO_HEIGHT, VIDEO_WIDTH, 3), rgb, dtype=np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        container.mux(stream.encode())


def one_error(capsys: pytest.CaptureFixture, *expected: str) -> str:
    """The one ``error:`` line on stderr (nothing else there), holding each of ``expected``."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    for text in expected:
        assert text in err, err
    return err
