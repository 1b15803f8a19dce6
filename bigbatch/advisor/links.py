"""Interconnect presets for ``bigbatch plan --link``: each link's latency alpha (seconds per message) and bandwidth
beta (bytes per second, one direction, what a ring's bus bandwidth reaches), with where the figures come from.

The all-reduce model (``model.py``) charges 2(N-1) alpha + 2(N-1)/N bytes/beta for a ring. nccl-tests reports
the same bandwidth as "bus bandwidth" (busbw = algbw x 2(N-1)/N for all-reduce), so a measured busbw is this beta
directly (NVIDIA/nccl-tests doc/PERFORMANCE.md). Where no measurement was found, beta is the link's line rate, an
upper bound (a real all-reduce reaches less: a RoCE link of 400 Gb/s gave 124 Gb/s point to point in
CCI-MOC/roce-testing RHELAI/3_nccl_tests/README.md), and alpha is an estimate; ``estimate`` says which.

A link given as two numbers (``--link 25,12``: alpha in microseconds, beta in GB/s) is the user's measurement,
e.g. from nccl-tests' all_reduce_perf: alpha from the time of the smallest sizes, beta from the busbw of the largest.
"""

from __future__ import annotations

from dataclasses import dataclass

from bigbatch.errors import UserError

GB = 1e9


@dataclass(frozen=True)
class Link:
    name: str
    alpha: float
    """Seconds per message (latency)."""
    beta: float
    """Bytes per second, one direction (a ring all-reduce's bus bandwidth)."""
    source: str
    estimate: str = ""
    """Which of the two figures is an estimate rather than a measurement ("" none)."""


NCCL_PERF = "NVIDIA/nccl-tests doc/PERFORMANCE.md (busbw = the ring's bandwidth term)"
LINKS: dict[str, Link] = {link.name: link for link in (
    Link("nvlink", 6e-6, 195 * GB,
         "beta: 195 GB/s measured one direction between A100s over NVLink (600 GB/s bidirectional), nccl-tests "
         "sendrecv_perf, li-plus/playground cuda/nccl.md; alpha: ~6 us small-message time of nccl-tests on one "
         "host (pastebin.com/ne4ipn6K: 6.2 us at 8 B)", "alpha"),
    Link("pcie", 6e-6, 20 * GB,
         "alpha: 6.2 us, nccl-tests all_reduce_perf at 8 B on 2 GPUs over PCIe (pastebin.com/ne4ipn6K); beta: PCIe "
         "4.0 x16 is 32 GB/s per direction raw, 20 GB/s taken as what a copy reaches", "beta"),
    Link("ib100", 10e-6, 12.5 * GB, "100 Gb/s InfiniBand (EDR) line rate, 12.5 GB/s; " + NCCL_PERF, "alpha, beta"),
    Link("ib200", 10e-6, 25 * GB, "200 Gb/s InfiniBand (HDR) line rate, 25 GB/s; " + NCCL_PERF, "alpha, beta"),
    Link("ib400", 10e-6, 50 * GB, "400 Gb/s InfiniBand (NDR) line rate, 50 GB/s; " + NCCL_PERF, "alpha, beta"),
    Link("eth10", 50e-6, 1.25 * GB,
         "10 Gb/s Ethernet line rate, 1.25 GB/s (NCCL over TCP sockets between two V100 hosts reached 0.8-1.0 GB/s "
         "busbw at 4-16 MB: gist.github.com/cswinter/3bc2cbcc7c947e4a2736188dd6e74240); alpha: TCP, estimated",
         "alpha, beta"),
    Link("eth25", 50e-6, 3.125 * GB, "25 Gb/s Ethernet line rate, 3.125 GB/s; alpha: TCP, estimated",
         "alpha, beta"),
)}
DEFAULT_LINK = "nvlink"


def parse_link(text: str) -> Link:
    """A preset's name, or ``ALPHA_US,BETA_GBPS`` (latency in microseconds, bandwidth in GB/s): ``UserError``
    naming ``--link`` otherwise."""
    key = text.strip().lower()
    if key in LINKS:
        return LINKS[key]
    parts = key.split(",")
    try:
        alpha_us, beta_gbps = (float(p) for p in parts)
    except ValueError:
        raise UserError(f"--link: {text!r} is neither a preset ({', '.join(LINKS)}) nor ALPHA_US,BETA_GBPS "
                        "(e.g. 25,12)") from None
    if not (alpha_us >= 0 and beta_gbps > 0) or alpha_us == float("inf") or beta_gbps == float("inf"):
        raise UserError(f"--link: {text!r}: the latency must be >= 0 us and the bandwidth > 0 GB/s, both finite")
    return Link(f"{alpha_us:g}us,{beta_gbps:g}GB/s", alpha_us * 1e-6, beta_gbps * GB, "given on the command line")
