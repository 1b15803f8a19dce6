"""``bigbatch plan CONFIG --devices ...``: check the options, take the largest micro-batch from the memory plan,
measure (``measure.py``), take the target from a run (``from_run.py``), and build the table (``table.py``); with
``--out RUN``, write ``RUN/advisor.json``. Every check that can fail runs before the measurement.

``RUN/advisor.json`` is written atomically (a reader sees the old file or the new one) and recorded as bigbatch's as
it is written (``floor/written.py``); an existing one is replaced only while it is that file, unchanged since, and
carries :data:`MARK`. Its content alone proves nothing (a hand-edited advisor file keeps the key): anything else there
is the user's, refused in one line and never overwritten; a link or what is not a regular file (a FIFO) is neither
followed nor read."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bigbatch.advisor.from_run import reached
from bigbatch.advisor.links import Link
from bigbatch.advisor.measure import Measured, measure
from bigbatch.advisor.model import s_min_from_run
from bigbatch.advisor.pair import DDP_SAMPLED, can_measure, measure_pair
from bigbatch.advisor.show import ADVISOR_FILE
from bigbatch.advisor.table import Advice, Target, advice_json, advise, check_layouts, default_batches
from bigbatch.config import RunConfig
from bigbatch.errors import UserError

MARK = "bigbatch_advisor"
"""The key an advisor.json bigbatch writes carries (a label: the proof it is bigbatch's is its write record)."""
MAX_DEVICES = 1_000_000
"""``--devices`` at most this many devices a count (past any cluster built)."""
MAX_BATCH = 2**40
"""``--batches`` at most this many images a batch (about 1.1 x 10^12; the run's own batch is bounded by the memory
its data order takes, ``telemetry/capacity.py``)."""
MAX_LISTED = 100
"""``--devices`` and ``--batches`` at most this many values each (the table has a row for every pair)."""
MAX_MEASURE_STEPS = 1000
"""``--measure-steps`` at most: the spread settles within tens of steps; this many is minutes of a large model."""


@dataclass(frozen=True)
class Options:
    devices: list[int]
    batches: list[int] | None
    link: Link
    measure_steps: int
    from_run: Path | None
    target_loss: float | None
    price: float | None
    out: Path | None
    budget: int | None
    pair: bool = True
    """Measure the overlap, the wait and the BN sums on two processes where several devices are asked for."""


def check(cfg: RunConfig, o: Options) -> list[int]:
    """The batches of the table; ``UserError`` (one line, naming the option) for what cannot work."""
    for option, values in (("--devices", o.devices), ("--batches", o.batches or [])):
        if len(values) > MAX_LISTED:
            raise UserError(f"{option}: at most {MAX_LISTED} values, got {len(values)}")
    if any(n < 1 for n in o.devices):
        raise UserError(f"--devices: device counts must be 1 or more, got {','.join(map(str, o.devices))}")
    if any(n > MAX_DEVICES for n in o.devices):
        raise UserError(f"--devices: at most {MAX_DEVICES} devices, got {max(o.devices)}")
    if o.batches is not None and any(b < 2 for b in o.batches):
        raise UserError(f"--batches: a batch must be 2 images or more, got {','.join(map(str, o.batches))}")
    if o.batches is not None and any(b > MAX_BATCH for b in o.batches):
        raise UserError(f"--batches: at most {MAX_BATCH} images a batch, got {max(o.batches)}")
    if not 2 <= o.measure_steps <= MAX_MEASURE_STEPS:
        raise UserError(f"--measure-steps: 2 to {MAX_MEASURE_STEPS} steps (their spread is the uncertainty), got "
                        f"{o.measure_steps}")
    if (o.from_run is None) != (o.target_loss is None):
        raise UserError("--from and --target-loss go together: the steps a run took to that loss")
    if o.price is not None and not o.price > 0:
        raise UserError(f"--price: a price per device-hour above 0, got {o.price:g}")
    if o.out is not None:
        check_out(o.out)
    batches = sorted(set(o.batches)) if o.batches is not None else default_batches(cfg.batch, o.devices)
    check_layouts(batches, sorted(set(o.devices)))
    if o.batches is not None:
        check_batch_fits(cfg, max(batches), "--batches")
    return batches


def check_batch_fits(cfg: RunConfig, largest: int, option: str) -> None:
    """``UserError`` naming ``option`` where the config at batch ``largest``, a fixed batch, is what ``show`` and
    ``train`` refuse before any work as more than this machine could hold (``telemetry/capacity.py``'s
    ``check_capacity``: the data order's 8 bytes an image, the images counted in 64 bits): no row's (``plan``) or
    new recipe's (``scale``) ``batch`` may be one that fails. Each of its checks grows with the batch, so the
    largest decides."""
    from bigbatch.config import validate_config
    from bigbatch.telemetry.capacity import check_capacity

    data = cfg.model_dump(mode="json")
    data.update(batch=largest, subdivisions=1)  # a fixed batch: no schedule.batch, no adaptive batch
    data["schedule"]["batch"] = []
    try:
        check_capacity(validate_config(data), 1)
    except UserError as error:
        detail = str(error).split(": ", 1)[1] if str(error).startswith(("batch: ", "steps: ", "epochs: ")) else error
        raise UserError(f"{option}: at batch {largest}, {detail}") from None


def check_out(out: Path) -> None:
    """``UserError`` (one line, naming ``--out`` and the file) unless ``out/advisor.json`` may be written: nothing is
    there, or what is there is an advisor file bigbatch wrote, unchanged since (the module docstring)."""
    import os
    import stat

    from bigbatch.floor import written

    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} is not a folder")
    file = out / ADVISOR_FILE
    try:
        st = os.lstat(file)
    except FileNotFoundError:
        return
    except OSError as error:
        raise UserError(f"--out: cannot look at {file} ({error.strerror or error})") from None
    if stat.S_ISLNK(st.st_mode):
        raise UserError(f"--out: {file} is a link; bigbatch neither follows nor replaces it (move it away)")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"--out: {file} is not a regular file; not read, not overwritten (move it away)")
    marked = _has_mark(file)
    if not (written.is_ours(file) and marked):
        if marked:
            raise UserError(f"--out: {file} looks like a bigbatch advisor file but bigbatch has no record of writing "
                            "it as it is now (edited since, copied, or written by an older bigbatch); not overwritten "
                            "(move it away)")
        raise UserError(f"--out: {file} exists and is not a bigbatch advisor file; not overwritten")


def _has_mark(file: Path) -> bool:
    """Whether ``file`` is a regular file of at most ``MAX_ADVISOR_BYTES`` holding JSON with :data:`MARK` 1 (a label:
    it proves nothing)."""
    from bigbatch.config.adaptive import MAX_ADVISOR_BYTES
    from bigbatch.floor.user_files import read_regular

    try:
        data = json.loads(read_regular(file, MAX_ADVISOR_BYTES, "an advisor file"))
    except (ValueError, OSError, RecursionError):
        return False
    return isinstance(data, dict) and data.get(MARK) == 1


def with_pair(cfg: RunConfig, o: Options, largest: int, measured: Measured,
              announce: Callable[[str], None] | None) -> Measured:
    """The measurement with the two-process one (``pair.py``) where more than one device is asked for and this
    machine can run two processes; else with the reason there is none (the overlap is then assumed)."""
    if max(o.devices) < 2:
        return measured
    reason = "--no-pair" if not o.pair else can_measure()
    if reason is None:
        if announce is not None:
            announce("measuring DDP's overlap, the wait and the BN sums on 2 processes of this machine "
                     f"({min(o.measure_steps, DDP_SAMPLED - 1)} steps after one warm-up)")
        try:
            return measured.with_pair(measure_pair(cfg, largest, o.measure_steps))
        except RuntimeError as e:
            reason = str(e)
    return replace(measured, pair_note=reason)


def largest_micro_batch(cfg: RunConfig, budget: int | None, per_device: int = 0) -> tuple[int, str]:
    """The largest micro-batch a device takes: the memory plan's (``subdivisions: auto``), else the config's; with
    ``budget`` (``--memory-limit``) the config's is measured as the plan measures it (``engine/planner.py``, one
    fresh process) and refused in one line where it does not fit. Either is measured beside a step of ``per_device``
    images (the table's largest per-device batch) where that is more than the config's: on the CPU and on unified
    memory a run holds its whole step's data (docs/memory.md), so a row's memory grows with its per-device batch."""
    from bigbatch.batching import largest_batch
    from bigbatch.engine.planner import RUN_MARGIN, MiB, measure_micro_batch, needed, plan_layout

    own = largest_batch(cfg)[1]  # the most images a step of the config's own run holds on one device
    beside = f" beside a step of {per_device} images a device (the largest row's)" if per_device > own else ""
    if cfg.subdivisions == "auto":
        plan = plan_layout(cfg, 1, budget, at_least=per_device)
        return plan.micro_batch, f"{plan.micro_batch}, the memory plan's at batch {cfg.batch}{beside}"
    micro = cfg.batch // int(cfg.subdivisions)
    why = f"{micro}, the config's ({cfg.batch} / subdivisions {cfg.subdivisions}; subdivisions=auto plans it)"
    if budget is None:
        return micro, why
    need = needed(measure_micro_batch(cfg, 1, micro, per_device))
    if need > budget:
        need_text = "more than the machine has" if need == float("inf") else f"{need / MiB:.0f} MiB"
        raise UserError(f"--memory-limit: the config's micro-batch of {micro} images (batch {cfg.batch} / "
                        f"subdivisions {cfg.subdivisions}){beside} needs {need_text} (its measured peak and a "
                        f"{RUN_MARGIN:.0%} margin), over {budget / MiB:.0f} MiB: raise subdivisions, or set "
                        "subdivisions=auto to plan it" + (", or give smaller --batches" if beside else ""))
    return micro, f"{why}, within --memory-limit{beside}: planned at {need / MiB:.0f} MiB"


def plan_devices(cfg: RunConfig, o: Options, announce: Callable[[str], None] | None = None) -> tuple[Advice, str]:
    """The advice and where its micro-batch came from (measures: seconds to minutes); ``announce``: told what is
    measured once every check passed."""
    batches = check(cfg, o)
    run = reached(o.from_run, o.target_loss) if o.from_run is not None and o.target_loss is not None else None
    if announce is not None:
        announce(f"measuring {o.measure_steps} training steps of {cfg.name} on this device (after one warm-up)")
    from bigbatch.engine.step import OUT_OF_MEMORY

    largest, why = largest_micro_batch(cfg, o.budget, max(batches) // min(o.devices))
    try:
        measured = measure(cfg, largest, o.measure_steps)
    except OUT_OF_MEMORY as error:  # the measured micro-batch did not fit this device (recut_on_oom=False)
        limit = "" if o.budget is not None else " or give --memory-limit to have it checked first"
        raise UserError(f"subdivisions: out of memory measuring micro-batches of up to {largest} images "
                        f"({str(error).splitlines()[0][:200]}); raise subdivisions, set subdivisions=auto{limit}"
                        ) from None
    measured = with_pair(cfg, o, largest, measured, announce)
    b_noise, b_sd = measured.noise_scale, measured.noise_scale_sd
    if run is None:
        target = Target(b_noise, b_sd, source=f"B_simple over the {measured.steps} measured steps")
    else:
        source = f"{o.from_run}'s noise_scale at step {run.steps}"
        if run.noise_scale is not None:
            relative = b_sd / b_noise if b_noise and b_sd is not None else 0.0
            b_noise, b_sd = run.noise_scale, run.noise_scale * relative  # the measurement's relative spread
        else:
            source = f"B_simple over the {measured.steps} measured steps ({o.from_run} records none)"
        s_min = s_min_from_run(run.steps, run.batch, b_noise) if b_noise is not None else None
        source += f"; S_min from its {run.steps} steps to {run.loss_kind} loss {o.target_loss:g} at batch {run.batch}"
        target = Target(b_noise, b_sd, s_min, run.batch, source)
    advice = advise(measured, batches, sorted(set(o.devices)), largest, o.link, target, o.price)
    if o.out is not None:
        write_advice(o.out, {MARK: 1, "config": cfg.name, "largest_micro_batch": largest, **advice_json(advice)})
    return advice, why


def write_advice(out: Path, data: dict) -> None:
    """``out/advisor.json``, checked again (the measurement took a while), written atomically and recorded as
    bigbatch's (``floor/written.py``): the proof by which a later ``plan`` may replace it."""
    from bigbatch.floor.files import atomic_write

    check_out(out)
    text = json.dumps(data, indent=1) + "\n"
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / ADVISOR_FILE, lambda f: f.write(text), mode="w", record=True)
    except OSError as error:  # a read-only file system, a full disk, no permission
        raise UserError(f"--out: cannot write {out / ADVISOR_FILE} ({error.strerror or error})") from None
