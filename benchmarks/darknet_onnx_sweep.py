"""Every stock Darknet ``.cfg`` (``tests/fixtures/darknet/stock/``) exported to ONNX and checked, as
``tests/darknet/test_stock_onnx.py`` does for one: built at the oracle's size with seeded random weights (eval
mode), written by ``write_onnx`` (dynamo, opset 18, batch 1) into a temporary folder, checked by ``check_file`` on 2
seeded random inputs. Each cfg runs in its own process with a timeout, so that one slow cfg does not block the rest;
prints one line per cfg and a summary, and writes the results as JSON lines (``--out``).

    python benchmarks/darknet_onnx_sweep.py [--jobs 1] [--timeout 900] [--threads 1] [--only SUBSTRING ...]
                                            [--out RESULTS.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one(key: str, threads: int) -> dict:
    """Build, export and check the cfg ``fork/name``; -> its result (status: refused, exported, failed)."""
    import torch

    torch.set_num_threads(threads)
    from bigbatch.errors import UserError
    from tests.darknet.test_stock_onnx import ORACLE, build, entry_id, export_and_check, stock_path

    entry = next(e for e in ORACLE if entry_id(e) == key)
    result = {"cfg": key, "width": entry.get("width"), "height": entry.get("height")}
    start = time.perf_counter()
    try:
        network = build(stock_path(entry), entry.get("width"), entry.get("height"))
    except UserError as refused:
        return {**result, "status": "refused", "reason": str(refused)}
    shape = network.input_shape
    result.update(width=shape.width, height=shape.height)
    with tempfile.TemporaryDirectory() as folder:
        try:
            worst = export_and_check(network, Path(folder))
        except Exception as error:  # noqa: BLE001 - every failure is reported, with its kind
            lines = traceback.format_exception(error)
            return {**result, "status": "failed", "error": type(error).__name__,
                    "reason": str(error)[:4000], "traceback": "".join(lines)[-6000:],
                    "seconds": round(time.perf_counter() - start, 1)}
        size = (Path(folder) / "net.onnx").stat().st_size
    return {**result, "status": "exported", "worst": worst, "bytes": size,
            "seconds": round(time.perf_counter() - start, 1)}


def run(key: str, timeout: float, threads: int) -> dict:
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--one", key, "--threads", str(threads)], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"cfg": key, "status": "timeout", "reason": f"over {timeout:g} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"cfg": key, "status": "crashed", "reason": f"exit {done.returncode}: {done.stderr[-2000:]}",
                "seconds": round(time.perf_counter() - start, 1)}
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per cfg")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per cfg")
    parser.add_argument("--only", nargs="*", default=[], help="the cfgs whose fork/name contains one of these")
    parser.add_argument("--out", type=Path, help="also write the results here, one JSON line a cfg")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.one:
        print(json.dumps(one(args.one, args.threads)), flush=True)
        return 0
    from tests.darknet.test_stock_onnx import ORACLE, entry_id

    keys = [entry_id(e) for e in ORACLE if not args.only or any(s in entry_id(e) for s in args.only)]
    results = []
    out = args.out.open("w", encoding="utf-8") if args.out else None
    with ThreadPoolExecutor(args.jobs) as pool:
        for result in pool.map(lambda k: run(k, args.timeout, args.threads), keys):
            results.append(result)
            if out:
                out.write(json.dumps(result) + "\n")
                out.flush()
            shown = (f"{result['worst']:.1e} in {result['seconds']} s" if result["status"] == "exported"
                     else result.get("reason", "").splitlines()[0][:150] if result.get("reason") else "")
            print(f"{result['cfg']:<48} {result['status']:<9} {shown}", flush=True)
    counts = {s: sum(r["status"] == s for r in results) for s in ("refused", "exported", "failed", "timeout",
                                                                   "crashed")}
    if out:
        out.close()
    print(f"{len(results)} cfgs: " + ", ".join(f"{n} {s}" for s, n in counts.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
