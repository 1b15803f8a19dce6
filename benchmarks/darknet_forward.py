"""YOLOv3 built from Darknet's yolov3.cfg (bigbatch.darknet) against the same network written by hand in
plain torch: time of one training iteration (forward + backward), side by side.

The hand-written network below is YOLOv3 as the paper and yolov3.cfg describe it: the Darknet-53 backbone (a 3x3
stem, then five stages, each a stride-2 3x3 convolution and 1, 2, 8, 8, 4 residual blocks of a 1x1 and a 3x3
convolution), and three heads, each five alternating 1x1/3x3 convolutions, a 3x3 and the 1x1 output convolution;
between heads a 1x1 lateral convolution, a 2x nearest upsample and a concatenation with the backbone's stride-16 or
stride-8 output. Every convolution but the outputs is conv (no bias) + BatchNorm + leaky ReLU (0.1). The weights of
the Darknet network are copied into it, and the outputs are checked equal before timing.

Rounds alternate which side goes first; each round times ``--steps`` iterations of each side (train mode, a mean
square of the outputs as the loss, gradients zeroed between iterations) after one warm-up iteration each. The
median of the per-round ratios Darknet / hand-written is reported.

    python benchmarks/darknet_forward.py [--cfg tests/fixtures/darknet/yolov3.cfg] [--batch 1] [--size 416]
                                         [--rounds 7] [--steps 2] [--device cpu] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from bigbatch.darknet import load_network, parameter_count

DEFAULT_CFG = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "darknet" / "yolov3.cfg"


# ----------------------------------------------------------------------------- YOLOv3 by hand


class CBL(nn.Module):
    """Conv (no bias) + BatchNorm + leaky ReLU(0.1); 'same' padding."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-5, momentum=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.bn(self.conv(x)), 0.1)


class Residual(nn.Module):
    """x + CBL3x3(CBL1x1(x)), the 1x1 halving the channels."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.reduce = CBL(c, c // 2, 1)
        self.expand = CBL(c // 2, c, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.expand(self.reduce(x))


def stage(cin: int, cout: int, blocks: int) -> nn.Sequential:
    """A stride-2 3x3 CBL, then ``blocks`` residual blocks."""
    return nn.Sequential(CBL(cin, cout, 3, 2), *(Residual(cout) for _ in range(blocks)))


def head_body(cin: int, c: int) -> nn.Sequential:
    """Five CBLs: 1x1 to c, 3x3 to 2c, 1x1 to c, 3x3 to 2c, 1x1 to c."""
    return nn.Sequential(CBL(cin, c, 1), CBL(c, 2 * c, 3), CBL(2 * c, c, 1), CBL(c, 2 * c, 3), CBL(2 * c, c, 1))


class HandYOLOv3(nn.Module):
    """YOLOv3 (Darknet-53 + three heads) for ``classes`` classes and 3 anchors per scale.

    Modules are registered in yolov3.cfg's layer order, so that the convolutions pair up one to one."""

    def __init__(self, classes: int = 80) -> None:
        super().__init__()
        out = 3 * (5 + classes)
        self.stem = CBL(3, 32, 3)
        self.stage1 = stage(32, 64, 1)
        self.stage2 = stage(64, 128, 2)
        self.stage3 = stage(128, 256, 8)  # stride 8: the third head's lateral input
        self.stage4 = stage(256, 512, 8)  # stride 16: the second head's
        self.stage5 = stage(512, 1024, 4)  # stride 32
        self.body1 = head_body(1024, 512)
        self.out1 = nn.Sequential(CBL(512, 1024, 3), nn.Conv2d(1024, out, 1))
        self.lateral1 = CBL(512, 256, 1)
        self.body2 = head_body(256 + 512, 256)
        self.out2 = nn.Sequential(CBL(256, 512, 3), nn.Conv2d(512, out, 1))
        self.lateral2 = CBL(256, 128, 1)
        self.body3 = head_body(128 + 256, 128)
        self.out3 = nn.Sequential(CBL(128, 256, 3), nn.Conv2d(256, out, 1))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        c3 = self.stage3(self.stage2(self.stage1(self.stem(x))))
        c4 = self.stage4(c3)
        c5 = self.stage5(c4)
        p5 = self.body1(c5)
        up = F.interpolate(self.lateral1(p5), scale_factor=2, mode="nearest")
        p4 = self.body2(torch.cat([up, c4], dim=1))
        up = F.interpolate(self.lateral2(p4), scale_factor=2, mode="nearest")
        p3 = self.body3(torch.cat([up, c3], dim=1))
        return [self.out1(p5), self.out2(p4), self.out3(p3)]


def copy_weights(darknet: nn.Module, hand: nn.Module) -> None:
    """Pair the convolutions and batch norms of both networks in order and copy Darknet's into the hand network."""
    pairs = [(d, h) for kind in (nn.Conv2d, nn.BatchNorm2d)
             for d, h in zip([m for m in darknet.modules() if isinstance(m, kind)],
                             [m for m in hand.modules() if isinstance(m, kind)], strict=True)]
    with torch.no_grad():
        for d, h in pairs:
            h.load_state_dict(d.state_dict())


# ----------------------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def iteration(model: nn.Module, x: torch.Tensor) -> None:
    loss = sum(o.float().square().mean() for o in model(x))
    loss.backward()
    model.zero_grad(set_to_none=True)


def timed(model: nn.Module, x: torch.Tensor, steps: int, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        iteration(model, x)
    sync(device)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cfg", type=Path, default=DEFAULT_CFG)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=416)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="iterations per side per round")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    darknet = load_network(args.cfg, args.size, args.size).to(device)
    classes = darknet.yolo_heads[0].classes
    hand = HandYOLOv3(classes).to(device)
    copy_weights(darknet, hand)
    assert parameter_count(darknet) == parameter_count(hand)
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    with torch.no_grad():  # the same function: equal outputs (eval mode, the copied running statistics)
        for a, b in zip(darknet.eval()(x), hand.eval()(x), strict=True):
            torch.testing.assert_close(a, b)
    darknet.train()
    hand.train()

    sides = {"darknet": darknet, "hand": hand}
    for model in sides.values():  # warm-up
        for _ in range(2):
            iteration(model, x)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            times[name].append(timed(sides[name], x, args.steps, device))
        print(f"round {r + 1}: darknet {times['darknet'][-1]:.3f} s, hand {times['hand'][-1]:.3f} s, "
              f"ratio {times['darknet'][-1] / times['hand'][-1]:.3f}", flush=True)
    ratios = [d / h for d, h in zip(times["darknet"], times["hand"], strict=True)]
    print(f"\nYOLOv3 from {args.cfg.name}, {parameter_count(darknet):,} parameters, batch {args.batch}, "
          f"{args.size}x{args.size}, forward + backward, {args.rounds} rounds x {args.steps} iterations")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print(f"median s/iteration: darknet {statistics.median(times['darknet']):.3f}, "
          f"hand {statistics.median(times['hand']):.3f}")
    print(f"median ratio darknet / hand: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
