"""The advisor's throughput prediction checked against runs: from one process's measurement (``bigbatch plan
--devices 1,2 --json``), predict the images/s of 2 processes (Gloo on this CPU, one thread each), then measure them
(``torchrun --nproc-per-node 2 -m bigbatch train``), with and without ``norm.sync=bigbatch``.

The link is measured first on this machine: two processes time Gloo all-reduces of 8 bytes and of 16 MiB; for two
processes a ring and a tree both cost 2 alpha + bytes/beta (``advisor/model.py``), so alpha = t(8 B) / 2 and beta =
16 MiB / (t(16 MiB) - 2 alpha). The prediction is given that link (``--link ALPHA_US,BETA_GBPS``). ``plan --devices
1,2`` measures, besides one process, two processes under DDP for a few steps (``advisor/pair.py``): DDP's overlap,
the wait for the slower process, and one cross-device BN sum while both train (the shared-memory path here,
``floor/host_all_reduce.py``); the model takes them. Those figures are printed, and, beside the prediction, what it
would be with the pair's compute per micro-batch in place of the one process's (``with pair compute``): the share
of the miss that the compute term explains.

Rounds alternate which side runs first (prediction, or the measured run). The measured images/s is the global batch
over the mean ``t_step`` of the run's training records, the first two left out; the predicted one is the ``(2,
batch)`` row's. Their ratio per round, and the median over the rounds, are printed with the parts of each side.

    python benchmarks/advisor.py [--rounds 2] [--steps 12] [--cases digits,digits-syncbn,resnet18,resnet18-syncbn]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
BIG = 16 * 2**20

CASES = {
    "digits": ["digits", "batch=128", "subdivisions=4"],
    "digits-syncbn": ["digits", "batch=128", "subdivisions=4", "norm.sync=bigbatch"],
    "resnet18": ["digits", "model.name=timm/resnet18", "data.name=folder", "data.size=64", "batch=32",
                 "subdivisions=2"],
    "resnet18-syncbn": ["digits", "model.name=timm/resnet18", "data.name=folder", "data.size=64", "batch=32",
                        "subdivisions=2", "norm.sync=bigbatch"],
}
QUIET = ["log.tensorboard=false", "log.updates=false", "eval.every=1000", "checkpoint.every=1000",
         "schedule.warmup=[]"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _link_worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(minutes=5))
    times = {}
    for name, numel, repeats in (("small", 2, 200), ("big", BIG // 4, 10)):
        tensor = torch.ones(numel)
        for _ in range(3):
            dist.all_reduce(tensor)
        dist.barrier()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            dist.all_reduce(tensor)
            samples.append(time.perf_counter() - start)
        times[name] = statistics.median(samples)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def measure_link() -> tuple[float, float]:
    """(alpha seconds, beta bytes/s) of Gloo between two processes here."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "link.json")
        mp.spawn(_link_worker, args=(_free_port(), out), nprocs=2, join=True)
        times = json.loads(Path(out).read_text())
    alpha = times["small"] / 2
    return alpha, BIG / max(times["big"] - 2 * alpha, 1e-9)


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def predict(case: list[str], link: str, steps: int, batch: int, cwd: Path) -> dict:
    command = [sys.executable, "-m", "bigbatch", "plan", case[0], "--devices", "1,2", "--batches", str(batch),
               "--measure-steps", str(steps), "--link", link, "--json", "--set", *case[1:], *QUIET]
    result = subprocess.run(command, env=_env(), cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"plan failed: {result.stderr[-2000:]}")
    data = json.loads(result.stdout)
    row = next(r for r in data["rows"] if r["devices"] == 2)
    measured, pair = data["measurement"], data["measurement"]["pair"]
    if pair is not None:  # the step with the pair's compute (per image) in place of the one process's
        alone = measured["step"]["compute_s"] / measured["step"]["micro_batch"]
        together = pair["compute_s"] / pair["micro_batch"]
        row["with_pair_compute"] = batch / (row["step"] + row["compute"] * (together / alone - 1))
    return row | {"measurement": measured}


def run_two(case: list[str], steps: int, out: Path, cwd: Path) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), "-m", "bigbatch", "train", case[0], "--out", str(out), "--set",
               *case[1:], *QUIET, f"steps={steps + 2}", "log.every=1"]
    result = subprocess.run(command, env=_env(), cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"train failed: {result.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_ = [r for r in records if "t_step" in r and "split" not in r][2:]  # the first two: start-up
    keys = ("t_step", "t_forward", "t_backward", "t_sync", "t_update", "t_other", "t_data", "t_bn_sync")
    return {k: statistics.fmean(r.get(k, 0.0) for r in steps_) for k in keys} | {"steps": len(steps_)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--cases", default="digits,digits-syncbn,resnet18,resnet18-syncbn")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="advisor-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"# {' '.join(sys.argv)}\n# {platform.processor() or platform.machine()}, nproc {os.cpu_count()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()}", flush=True)
    alpha, beta = measure_link()
    link = f"{alpha * 1e6:.1f},{beta / 1e9:.3f}"
    print(f"Gloo link, 2 processes: alpha {alpha * 1e6:.1f} us, beta {beta / 1e9:.3f} GB/s (--link {link})", flush=True)
    cases = args.cases.split(",")
    if any(name.startswith("resnet18") for name in cases):
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from batch_schedule import write_halves

        folder = work / "halves"
        if not folder.exists():
            write_halves(folder, train=400, val=40)
        CASES["resnet18"].append(f"data.path={folder}")
        CASES["resnet18-syncbn"].append(f"data.path={folder}")
    for name in cases:
        case = CASES[name]
        batch = int(next(v.split("=")[1] for v in case if v.startswith("batch=")))
        ratios, with_pair = [], []
        for r in range(args.rounds):
            sides = ("predict", "measure") if r % 2 == 0 else ("measure", "predict")
            got: dict[str, dict] = {}
            for side in sides:
                if side == "predict":
                    got[side] = predict(case, link, args.steps, batch, work)
                else:
                    got[side] = run_two(case, args.steps, work / f"{name}-{r}", work)
            p, m = got["predict"], got["measure"]
            measured_rate = batch / m["t_step"]
            ratios.append(p["images_per_s"] / measured_rate)
            with_pair.append(p.get("with_pair_compute", float("nan")) / measured_rate)
            pair = p["measurement"]["pair"] or {}
            print(f"{name} round {r + 1} ({sides[0]} first): predicted {p['images_per_s']:.1f} img/s "
                  f"(step {p['step']:.3f} s: compute {p['compute']:.3f}, grad {p['grad_sync']:.4f}, wait "
                  f"{p['wait']:.4f}, bn {p['bn_sync']:.4f}, update {p['update']:.3f}, data {p['data']:.3f}; pair: "
                  f"overlap {pair.get('overlap') or 0:.2f}, exposed {pair.get('exposed_s', 0):.4f}, all-reduce alone "
                  f"{pair.get('all_reduce_s', 0):.4f}, BN sum {1e3 * (pair.get('bn_collective_s') or 0):.2f} ms; "
                  f"with pair compute {p.get('with_pair_compute', float('nan')):.1f} img/s); measured "
                  f"{measured_rate:.1f} img/s (step {m['t_step']:.3f} s: forward+backward "
                  f"{m['t_forward'] + m['t_backward']:.3f}, sync {m['t_sync']:.4f}, bn_sync {m['t_bn_sync']:.4f}, "
                  f"update+other {m['t_update'] + m['t_other']:.3f}, data {m['t_data']:.3f}; {m['steps']} steps); "
                  f"predicted/measured {ratios[-1]:.3f}, with pair compute "
                  f"{p.get('with_pair_compute', float('nan')) / measured_rate:.3f}", flush=True)
        print(f"{name}: predicted/measured images/s, median of {len(ratios)}: {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f}); with the pair's compute "
              f"{statistics.median(with_pair):.3f} (range {min(with_pair):.3f}-{max(with_pair):.3f})", flush=True)
    print(f"# load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
