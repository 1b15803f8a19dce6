#!/usr/bin/env python3
"""Run the Darknet oracle over every stock .cfg of both forks and write oracle.json.

Usage (from anywhere; needs numpy, e.g. /work/main/.venv/bin/python):
    benchmarks/darknet_oracle/build.sh [DN_ROOT]
    python benchmarks/darknet_oracle/run.py [--dn DN_ROOT] [--out PATH] [--jobs N]
        [--timeout S] [--only NAME ...]

DN_ROOT holds the built forks AlexeyAB/ and pjreddie/ (default /tmp/dn). Each cfg
runs in its own subprocess (with the fork's repo root as the current directory,
so relative paths such as tree=data/9k.tree resolve) under a timeout; a crash
is recorded, not fatal. See README.md for the rules.
"""
import argparse
import concurrent.futures as cf
import glob
import math
import os
import re
import shutil
import subprocess

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FORKS = {"alexeyab": "AlexeyAB", "pjreddie": "pjreddie"}
MIRRORS = {"alexeyab": "/work/.mirror/AlexeyAB+darknet/repo",
           "pjreddie": "/work/.mirror/pjreddie+darknet/repo"}
NATIVE_SECTIONS = {"connected", "local", "crop", "detection"}


# ---------------- rules (numpy mirror of oracle.c, used for the read-back check) ----
def hash32(x):
    x = np.asarray(x, dtype=np.uint32)
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7feb352d)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846ca68b)
    x = x ^ (x >> np.uint32(16))
    return x


def u_of(k):
    return (hash32(k) >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def rule(k, role, fan_in):
    u = u_of(k)
    f = np.float32
    if role in ("biases", "rolling_mean", "other"):
        return f(0.2) * (u - f(0.5))
    if role == "scales":
        return f(0.8) + f(0.4) * u
    if role == "rolling_variance":
        return f(0.5) + u
    if role == "weights":
        return (f(2.0) * u - f(1.0)) * np.sqrt(f(3.0) / f(fan_in))
    raise ValueError(role)


def verify_weights(path, segpath):
    """Check net.weights against the rule in numpy; returns (ok, message)."""
    raw = np.fromfile(path, dtype=np.uint8)
    hdr = raw[:12].view(np.int32)
    vals = raw[20:].view(np.float32)
    segs = []
    with open(segpath) as fh:
        for line in fh:
            s, c, role, fan = line.split()
            segs.append((int(s), int(c), role, float(fan)))
    total = sum(c for _, c, _, _ in segs)
    if vals.size != total:
        return False, f"stream has {vals.size} values, segments {total}"
    if (hdr[0], hdr[1]) != (0, 2):
        return False, f"unexpected version {hdr.tolist()}"
    for s, c, role, fan in segs:
        chunk = 1 << 22
        for a in range(s, s + c, chunk):
            b = min(s + c, a + chunk)
            want = rule(np.arange(a, b, dtype=np.uint64).astype(np.uint32), role, fan)
            if not np.array_equal(vals[a:b].view(np.uint32), want.view(np.uint32)):
                bad = np.nonzero(vals[a:b].view(np.uint32) != want.view(np.uint32))[0][0] + a
                return False, f"mismatch at k={bad} ({role})"
    return True, None


# ---------------- cfg handling ----------------
def parse_net_section(text):
    """Return (sections, width, height) from a cfg text."""
    sections = re.findall(r"^\s*\[([A-Za-z_]+)\]", text, flags=re.M)
    width = height = None
    in_net = False
    for line in text.splitlines():
        st = line.strip()
        m = re.match(r"\[([A-Za-z_]+)\]", st)
        if m:
            in_net = m.group(1) in ("net", "network")
            continue
        if in_net:
            m = re.match(r"(width|height)\s*=\s*(\d+)", st)
            if m:
                if m.group(1) == "width":
                    width = int(m.group(2))
                else:
                    height = int(m.group(2))
    return [s.lower() for s in sections], width, height


def resized_text(text, size):
    """Replace only the [net] width=/height= lines; keep all others, line numbers unchanged."""
    out = []
    in_net = False
    for line in text.splitlines(keepends=True):
        st = line.strip()
        m = re.match(r"\[([A-Za-z_]+)\]", st)
        if m:
            in_net = m.group(1) in ("net", "network")
        elif in_net:
            m = re.match(r"(\s*)(width|height)(\s*=\s*)\d+(.*?)(\r?\n?)$", line)
            if m:
                line = f"{m.group(1)}{m.group(2)}{m.group(3)}{size}{m.group(4)}{m.group(5)}"
        out.append(line)
    return "".join(out)


# ---------------- running ----------------
def run_oracle(exe, fork_dir, cfg, outdir, timeout, shapes=False):
    os.makedirs(outdir, exist_ok=True)
    cmd = [exe, cfg, outdir] + (["--shapes"] if shapes else [])
    try:
        p = subprocess.run(cmd, cwd=fork_dir, capture_output=True, timeout=timeout)
        rc = p.returncode
        err = p.stderr.decode("utf-8", "replace")
        outtxt = p.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        return None, f"timeout after {timeout} s"
    if rc == 0:
        return 0, None
    lines = [line for line in (err + "\n" + outtxt).splitlines() if line.strip()]
    errl = [line for line in err.splitlines() if line.strip()]
    last = errl[-1] if errl else (lines[-1] if lines else "")
    if rc < 0:
        try:
            import signal
            sig = signal.Signals(-rc).name
        except Exception:
            sig = str(-rc)
        return rc, f"killed by {sig}; last stderr line: {last.strip()[:300]}"
    return rc, f"exit {rc}; last stderr line: {last.strip()[:300]}"


def read_meta(outdir):
    meta = {}
    with open(os.path.join(outdir, "meta.txt")) as fh:
        for line in fh:
            k, v = line.split()
            meta[k] = int(v)
    return meta


def read_layers(outdir):
    layers = []
    with open(os.path.join(outdir, "layers.txt")) as fh:
        for line in fh:
            p = line.split()
            d = {"type": p[1], "out_w": int(p[2]), "out_h": int(p[3]), "out_c": int(p[4]),
                 "outputs": int(p[5])}
            bn = int(p[6])
            if p[1] in ("convolutional", "connected"):
                d["batch_normalize"] = bool(bn)
            d["mean"] = float(p[7])
            d["std"] = float(p[8])
            d["max_abs"] = float(p[9])
            d["nonfinite"] = int(p[10])
            d["samples"] = [float(x) for x in p[11:19]]
            layers.append(d)
    return layers


def process(fork, exe, fork_dir, cfg, tmproot, timeout, commit):
    name = os.path.basename(cfg)
    work = os.path.join(tmproot, fork, name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(cfg, "rb") as fh:
        text = fh.read().decode("utf-8", "replace")
    sections, width, height = parse_net_section(text)
    entry = {"fork": fork, "cfg": name, "commit": commit, "built": False, "error": None,
             "width": width, "height": height, "native_width": width, "native_height": height,
             "reduced": False, "weights_bytes": None, "weights_verified": None, "layers": []}
    run_cfg = cfg
    need_native = (bool(NATIVE_SECTIONS & set(sections)) or width is None or height is None
                   or width * height <= 160 * 160)
    if not need_native:
        rc, err = run_oracle(exe, fork_dir, cfg, os.path.join(work, "shapes"), timeout, shapes=True)
        if rc != 0:
            entry["error"] = "at native size (shape pass): " + err
            return entry
        ws = []
        with open(os.path.join(work, "shapes", "shapes.txt")) as fh:
            for line in fh:
                p = line.split()
                if int(p[2]) > 0:
                    ws.append(int(p[2]))
        F = int(math.ceil(width / float(min(ws))))
        S = max(64, 2 * F)
        S = int(math.ceil(S / float(F))) * F
        if S < max(width, height):
            run_cfg = os.path.join(work, name)
            with open(run_cfg, "w", newline="") as fh:
                fh.write(resized_text(text, S))
            entry["width"] = entry["height"] = S
            entry["reduced"] = True
            entry["downsample_factor"] = F
    outdir = os.path.join(work, "run")
    rc, err = run_oracle(exe, fork_dir, run_cfg, outdir, timeout)
    entry["returncode"] = rc
    if os.path.exists(os.path.join(outdir, "meta.txt")):
        meta = read_meta(outdir)
        entry["weights_bytes"] = meta["weights_bytes"]
        entry["weights_verified"] = bool(meta["verify"])
        if meta["verify"]:
            ok, msg = verify_weights(os.path.join(outdir, "net.weights"),
                                     os.path.join(outdir, "segments.txt"))
            entry["weights_verified"] = ok
            if not ok:
                err = (err + "; " if err else "") + "numpy read-back check failed: " + msg
                rc = rc if rc else 99
    if rc == 0:
        entry["built"] = True
        entry["layers"] = read_layers(outdir)
    else:
        entry["error"] = err
    shutil.rmtree(work, ignore_errors=True)
    return entry


# ---------------- JSON writer (shortest float32 round-trip repr) ----------------
def fnum(x):
    if isinstance(x, float):
        if math.isnan(x):
            return '"nan"'
        if math.isinf(x):
            return '"inf"' if x > 0 else '"-inf"'
        s = str(np.float32(x))
        if s.endswith(".0"):
            s = s[:-2]
        return s
    return None


def dump(o, ind=0):
    import json
    pad = " " * ind
    if isinstance(o, dict):
        if not o:
            return "{}"
        if ind >= 6:  # layers: one line each
            return "{" + ", ".join(json.dumps(k) + ": " + dump(v, ind + 2) for k, v in o.items()) + "}"
        items = [pad + "  " + json.dumps(k) + ": " + dump(v, ind + 2) for k, v in o.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(o, list):
        if not o:
            return "[]"
        if all(not isinstance(v, (dict, list)) for v in o):
            return "[" + ", ".join(dump(v, ind) for v in o) + "]"
        items = [pad + "  " + dump(v, ind + 2) for v in o]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    if isinstance(o, bool) or o is None or isinstance(o, (int, str)):
        return json.dumps(o)
    if isinstance(o, float):
        return fnum(o)
    raise TypeError(type(o))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dn", default="/tmp/dn")
    ap.add_argument("--out", default=os.path.join(REPO, "tests/fixtures/darknet/stock/oracle.json"))
    ap.add_argument("--tmp", default="/tmp/dnoracle")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--only", nargs="*", default=None, help="cfg file names to run")
    ap.add_argument("--forks", nargs="*", default=list(FORKS))
    args = ap.parse_args()

    commits = {}
    tasks = []
    for fork in args.forks:
        d = os.path.join(args.dn, FORKS[fork])
        exe = os.path.join(HERE, "oracle_" + fork)
        commits[fork] = subprocess.check_output(
            ["git", "--git-dir=" + MIRRORS[fork], "rev-parse", "HEAD"]).decode().strip()
        for cfg in sorted(glob.glob(os.path.join(d, "cfg", "*.cfg"))):
            if args.only and os.path.basename(cfg) not in args.only:
                continue
            tasks.append((fork, exe, d, cfg))
    results = {}
    with cf.ThreadPoolExecutor(args.jobs) as ex:
        futs = {ex.submit(process, f, e, d, c, args.tmp, args.timeout, commits[f]): (f, c)
                for f, e, d, c in tasks}
        for fut in cf.as_completed(futs):
            f, c = futs[fut]
            try:
                r = fut.result()
            except Exception as exc:  # driver bug: record, keep going
                r = {"fork": f, "cfg": os.path.basename(c), "commit": commits[f], "built": False,
                     "error": f"driver error: {exc!r}", "layers": []}
            results[(f, os.path.basename(c))] = r
            print("{:<9} {:<32} {} {} {}".format(f, os.path.basename(c), "OK " if r["built"] else "ERR",
                                            "{}x{}".format(r.get("width"), r.get("height")),
                                            r.get("error") or ""), flush=True)
    entries = [results[k] for k in sorted(results)]
    doc = {
        "description": "Darknet's own per-layer forward outputs for its stock cfgs, "
                       "deterministic weights and input; see benchmarks/darknet_oracle/README.md",
        "float_format": "shortest float32 round-trip decimal; non-finite as strings nan/inf/-inf",
        "commits": commits,
        "entries": entries,
    }
    if args.only:
        # merge into an existing file instead of replacing it
        import json
        if os.path.exists(args.out):
            with open(args.out) as fh:
                old = json.load(fh)
            keep = [e for e in old["entries"] if (e["fork"], e["cfg"]) not in results]
            doc["entries"] = sorted(keep + entries, key=lambda e: (e["fork"], e["cfg"]))
            doc["commits"] = dict(old.get("commits", {}), **commits)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write(dump(doc) + "\n")
    nb = {f: sum(1 for e in doc["entries"] if e["fork"] == f and e["built"]) for f in commits}
    print("built:", nb, "of", {f: sum(1 for e in doc["entries"] if e["fork"] == f) for f in commits})


if __name__ == "__main__":
    main()
