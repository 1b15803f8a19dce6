"""Several machines simulated on this one: torchrun agents on localhost joined by the c10d rendezvous, each starting its
own workers (its own group rank and ``LOCAL_RANK``), with the run directory on storage they all see. They must train
as one agent of the same world size does, write from global rank 0 only, and restart together from the last
checkpoint when a worker of one of them is killed.

Every test waits as long as the machine needs (the rendezvous timeouts are ``rendezvous_conf()``'s, the hang guard),
takes its ports from the OS, kills in a ``finally`` every process it started, by its id (``launched``), and checks
that nothing is left: no process, no shared-memory segment of its workers in /dev/shm, no socket in LISTEN on the
ports the run used."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from bigbatch.floor.distributed import agree_on_attempt
from tests.helpers import (
    COMMON,
    HANG_GUARD_S,
    agents_env,
    assert_same_weights,
    elastic_rendezvous_conf,
    free_port,
    launched,
    listening_ports,
    processes_naming,
    rendezvous_conf,
    run_main,
    train_records,
    wait_for_agents,
    weights,
)

WORKER = """
import json, os, sys, time
from pathlib import Path

records, pause_at = Path(sys.argv[1]), int(sys.argv[2])
del sys.argv[1:3]
me = {key: os.environ[key] for key in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                       "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT")}
(records / f"worker-{os.getpid()}.json").write_text(json.dumps(me))

from bigbatch.engine import run_dir

take = run_dir._lock
def counted_lock(path, key):
    (records / f"lock-{os.getpid()}.json").write_text(json.dumps(me))
    return take(path, key)
run_dir._lock = counted_lock

paused = records / f"paused-rank{me['RANK']}"
if pause_at and paused.exists() and me["RANK"] == "0":
    time.sleep(5)  # a restarted rank 0 comes late, as from a slower machine: the others read the store first
if pause_at and not paused.exists():
    from bigbatch.engine.hooks import Hook
    from bigbatch.registry import HOOKS

    class PauseBeforeStep(Hook):
        stage = "write"

        def before_step(self, run):
            if run.step == pause_at:
                run.state.finish_writes()  # rank 0: the checkpoints so far are on disk
                (records / "tmp").write_text(str(os.getpid()))
                os.replace(records / "tmp", paused)
                while True:
                    time.sleep(60)

    HOOKS.register("pause", lambda run: PauseBeforeStep())

from bigbatch.cli import main
sys.exit(main())
"""
"""``bigbatch`` (as ``python -m bigbatch``) that first notes, in the folder ``argv[1]``, which worker it is (its pid,
ranks, restart count, store port) and, while running, each time it takes the run directory's lock. With ``argv[2]``
> 0, the first worker of each rank waits to be killed before that step (every rank of the first attempt pauses
there, not in a collective: the kill lands at a fixed step however busy the machine, and the workers of the other
agent stay healthy, so that their agent restarts them without counting a restart)."""

CROSS_DEVICE_BN = ["model.norm=batch", "subdivisions=1", "norm.sync=bigbatch"]


@dataclass
class Launch:
    """What a launch of agents left: the run directory, the agents' output, and what the workers noted."""

    out: Path
    owner: str
    codes: list[int]
    stdout: str
    stderr: str
    workers: dict[int, dict]  # pid -> its environment
    locks: dict[int, dict]  # pid of a worker that took the run directory's lock -> its environment
    ports: set[int]  # the rendezvous's and the workers' store's
    seconds: float


def agent_command(agents: int, per_agent: int, port: int, run_id: str, records: Path, out: Path,
                  settings: list[str], max_restarts: int = 0, pause_at: int = 0) -> list[str]:
    """One machine's command, the same on every machine: c10d assigns the agents their node ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(agents), "--nproc-per-node",
            str(per_agent), "--max-restarts", str(max_restarts), "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--rdzv-id", run_id, "--rdzv-conf", rendezvous_conf(),
            "--no-python", sys.executable, "-c", WORKER, str(records), str(pause_at),
            "train", "digits", "--out", str(out), "--set", *COMMON, *settings]


def read_launch(base: Path, procs, port: int, started: float) -> Launch:
    """What the agents ``procs``, launched into ``base`` (their logs in ``base/logs*``), left."""
    records = base / "records"
    workers = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in records.glob("worker-*.json")}
    locks = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in records.glob("lock-*.json")}
    logs = sorted(base.glob("logs*/agent*.out"))
    return Launch(base / "run", str(base), [proc.returncode for proc in procs],
                  "".join(log.read_text() for log in logs),
                  "".join(log.with_suffix(".err").read_text() for log in logs),
                  workers, locks, {port} | {int(w["MASTER_PORT"]) for w in workers.values()},
                  time.monotonic() - started)


def train_with_agents(base: Path, agents: int, per_agent: int, settings: list[str], **env: str) -> Launch:
    """``bigbatch train digits`` with ``COMMON`` and ``settings`` under ``agents`` torchrun agents of ``per_agent``
    processes each, into ``base/run``; waits for every agent to end."""
    (base / "records").mkdir(parents=True)
    port, run_id, started = free_port(), f"test-{secrets.token_hex(4)}", time.monotonic()
    command = agent_command(agents, per_agent, port, run_id, base / "records", base / "run", settings)
    with launched([command] * agents, base / "logs", agents_env(**env), owner=str(base)) as procs:
        wait_for_agents(procs)
    return read_launch(base, procs, port, started)


def assert_nothing_left(launch: Launch) -> None:
    """No process of the launch, no shared-memory segment made by one of its workers, no socket in LISTEN on its
    ports."""
    assert processes_naming(launch.owner) == []
    segments = [name for name in os.listdir("/dev/shm") if name.startswith("bigbatch-all-reduce-")
                and int(name.split("-")[3]) in launch.workers] if os.path.isdir("/dev/shm") else []
    assert segments == []
    assert launch.ports & listening_ports() == set(), f"still listening: {launch.ports & listening_ports()}"


def largest_difference(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a
               if a[k].is_floating_point() and not k.endswith(("running_mean", "running_var")))


@pytest.fixture(scope="module")
def one_agent(tmp_path_factory):
    """``one_agent(world, settings)``: the run of one agent of ``world`` processes (the reference), made once per
    module for each layout."""
    made: dict[tuple, Launch] = {}

    def run(world: int, settings: list[str]) -> Launch:
        key = (world, *settings)
        if key not in made:
            made[key] = train_with_agents(tmp_path_factory.mktemp("one-agent"), 1, world, settings)
            assert made[key].codes == [0], made[key].stderr[-3000:]
            assert_nothing_left(made[key])
        return made[key]

    return run


@pytest.mark.parametrize(
    ("per_agent", "settings", "env", "bn_route"),
    [
        pytest.param(1, CROSS_DEVICE_BN, {}, "shared memory", id="2x1-cross-device-bn"),
        pytest.param(1, CROSS_DEVICE_BN, {"BIGBATCH_HOST_ALL_REDUCE": "off"}, "gloo", id="2x1-cross-device-bn-gloo",
                     marks=pytest.mark.slow),
        pytest.param(2, ["model.norm=group", "subdivisions=1"], {}, None, id="2x2-groupnorm", marks=pytest.mark.slow),
        pytest.param(2, CROSS_DEVICE_BN, {"BIGBATCH_HOST_ALL_REDUCE": "off"}, "gloo", id="2x2-cross-device-bn-gloo",
                     marks=pytest.mark.slow),
    ],
)
def test_two_agents_train_as_one_agent_of_the_same_world_size(tmp_path, one_agent, per_agent, settings, env,
                                                              bn_route):
    """The weights of one agent of the same world size (cross-device BN: its sums through shared memory), within the
    layout tolerance; global rank 0 alone takes the run directory's lock, reports and writes the records; the BN sums
    go through shared memory where both agents may use it, through Gloo where the switch says off."""
    world = 2 * per_agent
    two = train_with_agents(tmp_path / "two-agents", 2, per_agent, ["log.every=1", *settings], **env)
    assert two.codes == [0, 0], two.stderr[-3000:]
    assert_nothing_left(two)
    reference = one_agent(world, ["log.every=1", *settings])
    difference = largest_difference(weights(reference.out), weights(two.out))
    print(f"largest weight difference, 2 agents x {per_agent} against 1 x {world}: {difference:.3g} "
          f"({two.seconds:.0f} s for the two agents)")
    assert_same_weights(weights(reference.out), weights(two.out))

    # each agent started its own workers, ranked by the rendezvous
    noted = sorted((int(w["GROUP_RANK"]), int(w["LOCAL_RANK"]), int(w["RANK"])) for w in two.workers.values())
    assert noted == [(g, local, g * per_agent + local) for g in range(2) for local in range(per_agent)]
    assert {(w["WORLD_SIZE"], w["LOCAL_WORLD_SIZE"]) for w in two.workers.values()} == {(str(world), str(per_agent))}
    # the run directory: locked once, by global rank 0, which alone reports and writes
    assert [lock["RANK"] for lock in two.locks.values()] == ["0"]
    holder = next(iter(two.locks))
    assert (two.out / ".bigbatch.lock").read_text().split("\n")[:2] == [str(holder), "run"]
    assert two.stdout.count("run written to") == 1
    assert [r["step"] for r in train_records(two.out)] == [1, 2, 3]
    if bn_route is not None:
        assert f"cross-device BN all-reduce over {bn_route} (inside" in two.stdout
        assert "cross-device BN all-reduce over shared memory (inside" in reference.stdout


STEPS = 20
PAUSE_AT = 7  # steps done when every worker of the first attempt pauses: the last checkpoint is step 5's


@pytest.mark.slow
def test_a_killed_worker_restarts_both_agents_from_the_last_checkpoint(tmp_path, one_agent):
    """Two agents x 1 process, ``--max-restarts 1``: the worker of global rank 1 is killed (SIGKILL) before step 8;
    its agent restarts it (restart count 1), the other agent, whose worker was healthy, restarts its own without
    counting (restart count 0): the counts differ, and the new workers still form one group (``agree_on_attempt``),
    resume from the checkpoint of step 5 and end with the weights of a run that was never interrupted."""
    base = tmp_path / "two-agents"
    records = base / "records"
    records.mkdir(parents=True)
    settings = [f"steps={STEPS}", "checkpoint.every=5", "eval.every=1000", *CROSS_DEVICE_BN]
    port, started = free_port(), time.monotonic()
    command = agent_command(2, 1, port, f"test-{secrets.token_hex(4)}", records, base / "run", settings,
                            max_restarts=1, pause_at=PAUSE_AT)
    with launched([command] * 2, base / "logs", agents_env(), owner=str(base)) as procs:
        markers = [records / "paused-rank0", records / "paused-rank1"]
        # The workers stay paused until killed: waiting for them is no race (the hang guard is pytest-timeout's).
        while not all(m.exists() for m in markers) and all(proc.poll() is None for proc in procs):
            time.sleep(0.05)
        assert all(m.exists() for m in markers), "an agent ended before its worker paused: " + "".join(
            (base / "logs" / f"agent{i}.err").read_text()[-3000:] for i in range(2))
        killed_at = torch.load(base / "run" / "checkpoints" / "last.pt", weights_only=True)["step"]
        paused = {rank: int(m.read_text()) for rank, m in enumerate(markers)}
        os.kill(paused[1], signal.SIGKILL)
        wait_for_agents(procs)
    launch = read_launch(base, procs, port, started)
    assert launch.codes == [0, 0], launch.stderr[-3000:]
    assert_nothing_left(launch)
    assert killed_at == 5, "killed after the first checkpoint, long before the end"

    first = {pid: w for pid, w in launch.workers.items() if pid in paused.values()}
    restarted = {pid: w for pid, w in launch.workers.items() if pid not in paused.values()}
    assert sorted(w["RANK"] for w in first.values()) == sorted(w["RANK"] for w in restarted.values()) == ["0", "1"]
    counts = {w["RANK"]: w["TORCHELASTIC_RESTART_COUNT"] for w in restarted.values()}
    assert counts == {"0": "0", "1": "1"}, "the agents' restart counts differ"
    assert sorted(lock["RANK"] for lock in launch.locks.values()) == ["0", "0"], "rank 0 of each attempt, alone"
    assert f"resumed from step {killed_at} of {STEPS}" in launch.stdout
    assert torch.load(launch.out / "checkpoints" / "last.pt", weights_only=True)["step"] == STEPS
    logged = [r["step"] for r in train_records(launch.out)]
    assert logged == sorted(set(logged)), "records of steps past the checkpoint were dropped, not duplicated"

    reference = one_agent(2, settings)
    difference = largest_difference(weights(reference.out), weights(launch.out))
    print(f"largest weight difference, restarted 2 agents x 1 against an uninterrupted 1 x 2: {difference:.3g} "
          f"({launch.seconds:.0f} s for the two agents)")
    assert_same_weights(weights(reference.out), weights(launch.out), atol=1e-6)


# --- elastic: a node lost or added mid-run (torchrun --nnodes 1:2) -----------------------------------------------

ELASTIC_WORKER = """
import json, os, sys, time
from pathlib import Path

records, pause_rank, pause_at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
del sys.argv[1:4]
me = {key: os.environ[key] for key in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT")}
me["agent"] = os.getppid()
(records / f"worker-{os.getpid()}.json").write_text(json.dumps(me))

paused = records / "paused"
if me["RANK"] == pause_rank and not paused.exists():
    from bigbatch.engine.hooks import Hook
    from bigbatch.registry import HOOKS

    class PauseBeforeStep(Hook):
        stage = "write"

        def before_step(self, run):
            if run.step >= pause_at:
                run.state.finish_writes()  # rank 0: the checkpoints so far are on disk
                (records / "tmp").write_text(json.dumps({"pid": os.getpid(), "agent": os.getppid(), "step": run.step}))
                os.replace(records / "tmp", paused)
                while True:
                    time.sleep(60)

    HOOKS.register("pause", lambda run: PauseBeforeStep())

from bigbatch.cli import main
sys.exit(main())
"""
"""``python -m bigbatch`` that notes in the folder ``argv[1]`` which worker it is (ranks, restart count, its agent's
pid) and, where it is the worker of global rank ``argv[2]`` and none has paused yet, waits to be killed before the
first step at or after ``argv[3]``: a fixed point of the run, however busy the machine, at which the test loses or
adds a node."""

ELASTIC_STEPS = 20
ELASTIC_SETTINGS = [f"steps={ELASTIC_STEPS}", "checkpoint.every=5", "eval.every=1000", "log.every=1",
                    "model.norm=group", "subdivisions=2"]
"""GroupNorm: a layout changes no normalisation, so the weights of a world change are an uninterrupted run's within
the layout tolerance."""
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""As docs/distributed.md says for ``--nnodes MIN:MAX``: each round's workers get a store of their own. With the agent's
store shared (torch's default), torch 2.14's agent of rank 0 builds the workers' store address once, at its first
rendezvous: an agent added later waits forever for the address in the new round's keys."""


@contextlib.contextmanager
def rendezvous_store():
    """The c10d rendezvous store, hosted by this process (``is_host=false`` in ``elastic_rendezvous_conf``): no agent
    hosts it, so that either can be lost, as a cluster's rendezvous endpoint outlives its nodes. Yields its port (the
    OS's choice); closed on the way out."""
    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=HANG_GUARD_S))
    try:
        yield server.port
    finally:
        del server


def elastic_command(port: int, run_id: str, records: Path, out: Path, pause_rank: str = "", pause_at: int = 0
                    ) -> list[str]:
    """One machine's command of an elastic job of 1 or 2 nodes, one process each."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1",
            "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
            run_id, "--rdzv-conf", elastic_rendezvous_conf(), "--no-python", sys.executable, "-c", ELASTIC_WORKER,
            str(records), pause_rank, str(pause_at), "train", "digits", "--out", str(out), "--set", *COMMON,
            *ELASTIC_SETTINGS]


def wait_for_pause(records: Path, procs) -> dict:
    """What the paused worker noted (its pid, its agent's, the step), once it has paused; fails the test if every agent
    ended first (the hang guard is pytest-timeout's: a paused worker waits to be killed)."""
    paused = records / "paused"
    while not paused.exists() and any(proc.poll() is None for proc in procs):
        time.sleep(0.05)
    assert paused.exists(), "the agents ended before the worker paused: " + "".join(
        log.read_text()[-3000:] for log in sorted(records.parent.glob("logs*/agent*.err")))
    return json.loads(paused.read_text())


def segments(out: Path) -> list[tuple]:
    """Each start of the run as ``metrics.jsonl`` records it: (event, step, world, subdivisions, micro-batch)."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["event"], r["step"], r["world"], r["subdivisions"], r["micro_batch"]) for r in records
            if r.get("event") in ("started", "resumed")]


def uninterrupted(tmp_path: Path, subdivisions: int) -> dict:
    """The weights of the same run in this process, never interrupted, at the same micro-batch."""
    result = run_main("train", "digits", "--out", str(tmp_path / "uninterrupted"), "--set", *COMMON, *ELASTIC_SETTINGS,
                      f"subdivisions={subdivisions}")
    assert result.returncode == 0, result.stderr
    return weights(tmp_path / "uninterrupted")


@pytest.mark.slow  # make test-slow: 50 s, most of it the rendezvous waiting out the lost node (20 s, then 10 s)
def test_a_node_lost_mid_run_leaves_the_other_to_finish_on_one_process(tmp_path):
    """Two agents of one process join; before step 7 the agent of the worker of global rank 1 is lost with its worker
    (SIGKILL, as a machine dies). The other worker's collective fails, its agent restarts it: the rendezvous takes the
    silent agent for lost and goes on with one node. The worker resumes from step 5's checkpoint on 1 process with
    the micro-batch kept (subdivisions 2 -> 4), finishes, and ends with the weights of a run never interrupted."""
    base = tmp_path / "lost"
    records = base / "records"
    records.mkdir(parents=True)
    started = time.monotonic()
    with rendezvous_store() as port:
        command = elastic_command(port, f"test-{secrets.token_hex(4)}", records, base / "run", "1", 7)
        with launched([command] * 2, base / "logs", agents_env(**ELASTIC_ENV), owner=str(base)) as procs:
            paused = wait_for_pause(records, procs)
            lost = next(proc for proc in procs if proc.pid == paused["agent"])
            os.killpg(lost.pid, signal.SIGKILL)  # the agent, and then its worker (a session of its own)
            os.kill(paused["pid"], signal.SIGKILL)
            lost.wait()
            wait_for_agents([proc for proc in procs if proc is not lost])
    launch = read_launch(base, procs, port, started)
    survivor = [code for proc, code in zip(procs, launch.codes, strict=True) if proc is not lost]
    assert survivor == [0], launch.stderr[-3000:]
    assert_nothing_left(launch)

    assert paused["step"] == 7
    assert segments(launch.out) == [("started", 0, 2, 2, 16), ("resumed", 5, 1, 4, 16)]
    assert "resuming on 1 process (the checkpoint's run: 2): subdivisions 4, micro-batch 16 (kept)" in launch.stdout
    last = [w for w in launch.workers.values() if w["WORLD_SIZE"] == "1"]
    assert [w["TORCHELASTIC_RESTART_COUNT"] for w in last] == ["1"], "restarted once, by its agent"
    assert torch.load(launch.out / "checkpoints" / "last.pt", weights_only=True)["step"] == ELASTIC_STEPS
    expected = uninterrupted(tmp_path, 4)
    print(f"largest weight difference, node lost at step 7 against uninterrupted: "
          f"{largest_difference(expected, weights(launch.out)):.3g} ({launch.seconds:.0f} s for the agents)")
    assert_same_weights(expected, weights(launch.out))


@pytest.mark.slow
def test_a_node_added_mid_run_restarts_the_workers_on_two_processes(tmp_path):
    """One agent starts alone (the rendezvous waits its last call, then goes on with one node); before step 7 a second
    agent joins. The first agent sees a node waiting and restarts its worker; both workers resume from step 5's
    checkpoint on 2 processes with the micro-batch kept (subdivisions 2 -> 1), finish, and end with the weights of a
    run never interrupted."""
    base = tmp_path / "added"
    records = base / "records"
    records.mkdir(parents=True)
    started, run_id = time.monotonic(), f"test-{secrets.token_hex(4)}"
    with rendezvous_store() as port:
        first_command = elastic_command(port, run_id, records, base / "run", "0", 7)
        with launched([first_command], base / "logs", agents_env(**ELASTIC_ENV), owner=str(base)) as first:
            paused = wait_for_pause(records, first)
            added_command = elastic_command(port, run_id, records, base / "run")
            with launched([added_command], base / "logs-added", agents_env(**ELASTIC_ENV), owner=str(base)) as added:
                wait_for_agents([*first, *added])
    launch = read_launch(base, [*first, *added], port, started)
    assert launch.codes == [0, 0], launch.stderr[-3000:]
    assert_nothing_left(launch)

    assert paused["step"] == 7
    assert segments(launch.out) == [("started", 0, 1, 2, 32), ("resumed", 5, 2, 1, 32)]
    assert "resuming on 2 processes (the checkpoint's run: 1): subdivisions 1, micro-batch 32 (kept)" in launch.stdout
    assert torch.load(launch.out / "checkpoints" / "last.pt", weights_only=True)["step"] == ELASTIC_STEPS
    expected = uninterrupted(tmp_path, 2)
    print(f"largest weight difference, node added at step 7 against uninterrupted: "
          f"{largest_difference(expected, weights(launch.out)):.3g} ({launch.seconds:.0f} s for the agents)")
    assert_same_weights(expected, weights(launch.out))


# --- the name each attempt's workers agree on ---------------------------------------------------------------------


def _agree(port: int, rank: int, world: int, names: list) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=HANG_GUARD_S))
    names[rank] = agree_on_attempt(store, rank, world, poll_s=0.01)


@pytest.mark.fast
@pytest.mark.parametrize("rank0_first", [True, False], ids=["rank0-first", "rank0-last"])
def test_each_attempt_agrees_on_a_new_name_whatever_earlier_attempts_left(rank0_first):
    """Three ranks, four attempts on one store (as torchrun's store outlives its restarts): every rank of an attempt
    gets the same name, and no attempt an earlier one's. Before the first, the store holds the hello of a dead process
    of rank 1 and none of rank 2 (a worker killed before it said hello); rank 0 starting before the others reads the
    earlier attempts' hellos first."""
    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=HANG_GUARD_S))
    server.set("bigbatch/hello/1", "0123456789abcdef")
    seen = []
    for _ in range(4):
        names: list = [None] * 3
        order = (0, 1, 2) if rank0_first else (2, 1, 0)
        threads = [threading.Thread(target=_agree, args=(server.port, rank, 3, names), daemon=True) for rank in order]
        for thread in threads:
            thread.start()
            time.sleep(0.05)
        for thread in threads:
            thread.join(timeout=HANG_GUARD_S)
        assert None not in names and len(set(names)) == 1, names
        assert names[0] not in seen
        seen.append(names[0])


@pytest.mark.fast
def test_a_switch_value_it_does_not_know_is_an_error_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("BIGBATCH_HOST_ALL_REDUCE", "shm")
    result = run_main("train", "digits", "--out", str(tmp_path / "run"), "--set", *COMMON, *CROSS_DEVICE_BN)
    assert result.returncode == 2
    assert result.stderr == "error: BIGBATCH_HOST_ALL_REDUCE='shm': expected auto or off (1 or 0)\n"
    assert not (tmp_path / "run").exists()
    assert run_main("show", "digits", "--set", "model.norm=batch").returncode == 0, "read with cross-device BN only"
    monkeypatch.setenv("BIGBATCH_HOST_ALL_REDUCE", "OFF")
    assert run_main("show", "digits", "--set", *CROSS_DEVICE_BN).returncode == 0
