"""The advisor's two-process measurement: what one process alone cannot show, measured on two real
``torch.distributed`` processes of this machine (Gloo on the CPU, NCCL where there are two GPUs, one each) that
train the config's step under DDP for a few steps (the run's own step, loader and phase clock: ``session.py``),
each with its share of the batch. It trains nothing past them and writes nothing but its result.

Read at each measured step (the first is a warm-up; DDP rebuilds its buckets there):

- DDP's own timing of the synchronising backward (``DistributedDataParallel._get_ddp_logging_data()``, set by
  torch's ``c10d::Logger`` from the reducer's timer, for the first 10 synchronising iterations): its backward
  compute (start to the last gradient ready), its communication (the first bucket's all-reduce launched to the last
  one done) and their overlap (the first bucket launched to the last gradient ready). The overlap over the backward
  is the share of the backward that hides the all-reduce: ``overlap``, a property of the model's bucket layout (the
  first buckets are ready only once the backward has reached them), whatever the link.
- The phase clock's ``t_sync``: how much longer the synchronising backward took than the others of the step
  (``engine/phases.py``). It holds DDP's exposed communication (the last gradient ready to the last all-reduce
  done) and what the all-reduce running beside the backward costs it (on a CPU they share the cores, so a hidden
  all-reduce still slows the backward down). With one micro-batch a process there is no other backward to compare
  with, and DDP's exposed communication stands for it.
- The cross-device BatchNorm sums (``norm.sync``), the phase clock's ``t_bn_sync``: per collective, over the 2 x
  BN layers x micro-batches of a step, ``bn_collective_s``. It is what a sum costs while both processes train (the
  wait for the other process at the same layer, and this machine's path: shared memory or Gloo), not what it costs
  between idle processes.

After the steps, the same processes time the gradient's bytes all-reduced alone (``all_reduce_s``; and 8 bytes,
``alpha_s`` = half of it, as for 2 processes a ring and a tree both cost 2 alpha + bytes/beta). The part of
``t_sync`` that the all-reduce itself does not explain, t_sync - max(0, all_reduce_s - overlap x backward), is
``wait_s``: the wait for the slower process of the pair (a straggler) and the backward slowed by the all-reduce
beside it, which the link's two numbers do not cost.

Each figure is the mean over the measured steps of both processes, with its standard deviation. The compute of the
pair (forward and backward of a micro-batch less the BN sums) is kept too, beside the one-process figure: on a GPU
host each process has its own device and the two agree; on a CPU host they share the cores.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bigbatch.config import RunConfig, validate_config

PAIR = 2
DDP_SAMPLED = 10
"""DDP's reducer times its first 10 synchronising iterations (then one in 100): the steps read here."""


@dataclass(frozen=True)
class PairMeasured:
    steps: int
    """Steps whose DDP timing was read (the warm-up not counted)."""
    batch: int
    micro_batch: int
    subdivisions: int
    """Micro-batches per process per step."""
    overlap: float | None
    """Share of the synchronising backward during which the all-reduce ran (None: DDP timed no communication)."""
    overlap_sd: float
    backward_s: float
    """DDP's backward compute of the synchronising micro-batch."""
    exposed_s: float
    """DDP's communication left after the backward (mean)."""
    sync_s: float
    """The phase clock's ``t_sync`` (mean; DDP's exposed communication with one micro-batch a process)."""
    wait_s: float
    """``sync_s`` the all-reduce alone does not explain: the wait for the other process, the backward slowed."""
    wait_sd: float
    bn_collective_s: float | None
    """One cross-device BN sum while training (None: the config does not synchronise BN)."""
    bn_collective_sd: float
    all_reduce_s: float
    """The gradient's bytes all-reduced alone between the two processes."""
    alpha_s: float
    compute_s: float
    """Forward and backward of one micro-batch while the other process trains, less the BN sums."""
    device: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def can_measure() -> str | None:
    """None where this machine runs a pair (two GPUs, or a CPU of two cores or more), else why not."""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return None if count >= PAIR else f"{count} GPU here: two processes need a GPU each"
    cores = os.cpu_count() or 1
    return None if cores >= PAIR else f"{cores} CPU core here: two processes would share one"


def pair_layout(batch: int, largest_micro_batch: int) -> tuple[int, int]:
    """(global batch, micro-batch) of the pair's step: the config's batch (at least 2 images a process), in the
    largest micro-batches that fit and divide a process's share, two per process where the share allows (the
    synchronising backward is then the last of several, as in a run with subdivisions)."""
    from bigbatch.advisor.model import micro_batch_for

    batch = max(batch - batch % PAIR, 2 * PAIR)
    share = batch // PAIR
    micro = micro_batch_for(batch, PAIR, min(largest_micro_batch, max(1, share // 2)))
    assert micro is not None  # micro_batch_for(b, 2, >= 1) with b even always has 1
    return batch, micro


class _DdpReadings:
    """Micro-batch hooks that read DDP's timing of the previous synchronising iteration: torch sets it at the
    forward of the next synchronising micro-batch, so it is read after that micro-batch's backward."""

    KEYS = ("backward_compute_time", "backward_comm_time", "backward_compute_comm_overlap_time")

    def __init__(self, train_step: Any, subdivisions: int) -> None:
        self.train_step, self.last = train_step, subdivisions - 1
        self.by_iteration: dict[int, dict[str, float]] = {}

    def before_forward(self, index: int) -> None:
        pass

    def after_backward(self, index: int) -> None:
        if index != self.last:
            return
        reader = getattr(self.train_step.model, "_get_ddp_logging_data", None)
        data = reader() if reader is not None else {}
        iteration = data.get("iteration")
        if isinstance(iteration, int) and iteration >= 1 and all(isinstance(data.get(k), int) for k in self.KEYS):
            # the stats of synchronising iteration ``iteration`` (1-based): step ``iteration - 1``
            self.by_iteration[iteration - 1] = {k: data[k] * 1e-9 for k in self.KEYS}


def _timed_all_reduce(numel: int, repeats: int, device: torch.device) -> float:
    import torch.distributed as dist

    tensor = torch.ones(numel, device=device)
    for _ in range(2):
        dist.all_reduce(tensor)
    samples = []
    for _ in range(repeats):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _worker(rank: int, job: dict[str, Any]) -> None:
    """One process of the pair: the steps, DDP's readings, then the all-reduces alone; writes ``rank<r>.json`` into
    the job's folder."""
    import torch.distributed as dist

    from bigbatch.floor.distributed import setup

    for key in ("GROUP_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(key, None)
    # The pair meets in the store measure_pair holds, as torchrun's workers meet in their agent's.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job["port"]), RANK=str(rank), WORLD_SIZE=str(PAIR),
                      LOCAL_RANK=str(rank), TORCHELASTIC_USE_AGENT_STORE="True")
    if not torch.cuda.is_available():
        torch.set_num_threads(job["threads"])
    proc = setup()
    try:
        result = _measure(job, proc)
        Path(job["out"], f"rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")
    finally:
        # DDP freed before its process group goes: a DDP left alive until the interpreter's exit can abort a Gloo
        # process ("terminate called without an active exception", as the trainer found; 3 of 14 pairs failed so
        # before this, 0 of 12 after). _measure's session is gone with its frame; the collection catches any cycle.
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()


def _measure(job: dict[str, Any], proc: Any) -> dict[str, Any]:
    """This process's readings of the pair's steps (``_worker``)."""
    from bigbatch.advisor.session import Session, batchnorm_sizes

    steps = job["steps"]
    total = steps + 2  # a warm-up, the measured steps, and one whose forward hands DDP's timing of the last
    session = Session(validate_config(job["config"]), proc, job["batch"], job["micro"], total)
    readings = _DdpReadings(session.parts.step, session.subdivisions)
    times = []
    batches = session.loader(0, total)
    for step in range(total):
        measured = session.step(step, batches, readings)
        if 1 <= step <= steps and measured is not None:
            times.append(measured)
    del batches
    model = session.parts.model
    gradient_numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    all_reduce_s = _timed_all_reduce(gradient_numel, 5, proc.device)
    small_s = _timed_all_reduce(2, 50, proc.device)
    bn_layers, _ = batchnorm_sizes(model)
    return {
        "ddp": [readings.by_iteration[s] for s in range(1, steps + 1) if s in readings.by_iteration],
        "times": times, "all_reduce_s": all_reduce_s, "small_s": small_s, "subdivisions": session.subdivisions,
        "bn_layers": bn_layers, "bn_sync": session.cfg.norm.sync != "none",
        "device": torch.cuda.get_device_name(proc.device) if proc.device.type == "cuda" else "cpu",
    }


def _mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(results: list[dict], batch: int, micro: int) -> PairMeasured:
    """The pair's figures from both processes' readings (module docstring); pure, for the tests."""
    ddp = [r for result in results for r in result["ddp"]]
    times = [t for result in results for t in result["times"]]
    subdivisions, all_reduce_s = results[0]["subdivisions"], max(r["all_reduce_s"] for r in results)
    backward = [r["backward_compute_time"] for r in ddp]
    timed = [r for r in ddp if r["backward_comm_time"] > 0 and r["backward_compute_time"] > 0]
    fractions = [min(1.0, max(0.0, r["backward_compute_comm_overlap_time"] / r["backward_compute_time"]))
                 for r in timed]
    overlap, overlap_sd = _mean_sd(fractions)
    exposed = [max(0.0, r["backward_comm_time"] - r["backward_compute_comm_overlap_time"]) for r in timed]
    syncs = [t["t_sync"] for t in times] if subdivisions > 1 else exposed
    sync, sync_sd = _mean_sd(syncs)
    explained = max(0.0, all_reduce_s - overlap * _mean_sd(backward)[0]) if timed else all_reduce_s
    wait, wait_sd = max(0.0, sync - explained), sync_sd
    bn_calls = 2 * results[0]["bn_layers"] * subdivisions
    bn_collective, bn_sd = None, 0.0
    if results[0]["bn_sync"] and bn_calls:
        bn_collective, bn_sd = _mean_sd([t.get("t_bn_sync", 0.0) / bn_calls for t in times])
    compute = [(t["t_forward"] + t["t_backward"] - t.get("t_bn_sync", 0.0)) / subdivisions for t in times]
    return PairMeasured(
        steps=len(ddp) // max(1, len(results)), batch=batch, micro_batch=micro, subdivisions=subdivisions,
        overlap=overlap if timed else None, overlap_sd=overlap_sd, backward_s=_mean_sd(backward)[0],
        exposed_s=_mean_sd(exposed)[0], sync_s=sync, wait_s=wait, wait_sd=wait_sd, bn_collective_s=bn_collective,
        bn_collective_sd=bn_sd, all_reduce_s=all_reduce_s, alpha_s=min(r["small_s"] for r in results) / 2,
        compute_s=_mean_sd(compute)[0], device=results[0]["device"])


def measure_pair(cfg: RunConfig, largest_micro_batch: int, steps: int) -> PairMeasured:
    """Two processes of this machine (``python -m bigbatch.advisor.pair RANK JOB``), ``min(steps, 9)`` measured steps
    each after a warm-up (module docstring); ``RuntimeError`` naming the failure where one fails (the other is then
    stopped)."""
    import torch.distributed as dist

    batch, micro = pair_layout(cfg.batch, largest_micro_batch)
    # The pair's store, held here from the start on a port the kernel gives it (as torchrun's agent holds its
    # workers'): a port picked free and bound later by a rank could be taken by another process in between.
    store = dist.TCPStore("127.0.0.1", 0, PAIR, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="bigbatch-pair-") as out:
        job = {"port": store.port, "config": cfg.model_dump(mode="json"), "batch": batch, "micro": micro,
               "steps": max(1, min(steps, DDP_SAMPLED - 1)), "threads": max(1, torch.get_num_threads() // PAIR),
               "out": out}
        job_file = Path(out, "job.json")
        job_file.write_text(json.dumps(job), encoding="utf-8")
        env = {key: value for key, value in os.environ.items()
               if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        logs = [Path(out, f"rank{r}.log") for r in range(PAIR)]
        procs = []
        for rank, log in enumerate(logs):
            with log.open("w", encoding="utf-8") as f:
                procs.append(subprocess.Popen([sys.executable, "-m", "bigbatch.advisor.pair", str(rank), str(job_file)],
                                              env=env, stdout=f, stderr=subprocess.STDOUT))
        try:
            failed = _wait_all(procs)
        finally:  # interrupted (Ctrl-C): the pair goes too
            _stop(procs)
        if failed is not None:
            log = logs[failed].read_text(encoding="utf-8", errors="replace")
            raise RuntimeError(f"the two-process measurement failed (process {failed}): "
                               f"{failure_line(log) or f'exit status {procs[failed].returncode}'}")
        results = [json.loads(Path(out, f"rank{r}.json").read_text(encoding="utf-8")) for r in range(PAIR)]
    return summarise(results, batch, micro)


def failure_line(log: str) -> str | None:
    """The line of a failed rank's log that says why: the exception that ends its last Python traceback, where it
    has one (a line that a library printed after it, such as Gloo's ``terminate called without an active
    exception`` as the process went down, is not the reason); else the log's last line; ``None`` for an empty log."""
    lines = [line.rstrip() for line in log.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if starts:
        after = [line for line in lines[starts[-1] + 1:] if not line[0].isspace()]
        if after:
            return after[0]
    return lines[-1].strip() if lines else None


def _wait_all(procs: list[subprocess.Popen]) -> int | None:
    """Wait for every process; where one fails, stop the others (they would wait for it in a collective) and
    answer its rank."""
    while True:
        codes = [p.poll() for p in procs]
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None:
            _stop(procs)
            return failed
        if all(code == 0 for code in codes):
            return None
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    from bigbatch.floor.process_exit import exit_now

    _worker(int(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text(encoding="utf-8")))
    exit_now(0)  # as a run's processes end: without the interpreter's teardown
