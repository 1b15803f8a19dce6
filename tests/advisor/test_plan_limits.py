"""What ``bigbatch plan`` and the memory plan count and refuse: ``--memory-limit`` with a numeric ``subdivisions``
(the config's micro-batch measured against it, refused in one line where it does not fit), an out-of-memory error in
the advisor's measurement (one line, not a traceback), ``--from`` a run whose batch changed (refused: S_min is the
steps at one batch), and a unified-memory GPU (a Jetson), where the host's memory and the CUDA allocator's reserved
memory come out of the one RAM and are counted together.

The measurements are stand-ins (``planner.measure``, the advisor's ``measure``): what is tested is what the command
does with them, in this process (tests/helpers.py ``run_main``)."""

from __future__ import annotations

import io
import json
import resource
from contextlib import redirect_stdout
from types import SimpleNamespace

import pytest
import torch

from bigbatch.advisor import command
from bigbatch.config import load_config
from bigbatch.engine import planner
from bigbatch.engine.planner import Measurement
from bigbatch.telemetry import memory
from tests.helpers import run_main

pytestmark = pytest.mark.fast

MiB = 2**20


def one_error_line(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def stand_in_measurements(monkeypatch, process_mib: float) -> list[tuple[int, int]]:
    """``planner.measure`` answering ``process_mib`` for every micro-batch; returns what it was asked."""
    asked: list[tuple[int, int]] = []

    def measure(cfg, micro_batch, per_device):
        asked.append((micro_batch, per_device))
        return Measurement(micro_batch, int(process_mib * MiB), 1.0)

    monkeypatch.setattr(planner, "measure", measure)
    return asked


def test_a_numeric_subdivisions_whose_micro_batch_does_not_fit_the_memory_limit_is_refused(monkeypatch):
    """Planned at 1.15 x 1,000 MiB = 1,150 MiB, micro-batch 512 does not fit 1 GiB: refused in one line, before the
    advisor's measurement (which would have trained micro-batches of 512 in this process)."""
    asked = stand_in_measurements(monkeypatch, 1000)
    monkeypatch.setattr(command, "measure", lambda *args: pytest.fail("measured past the limit"))
    line = one_error_line(run_main("plan", "digits", "--set", "batch=1024", "subdivisions=2", "--devices", "1",
                                   "--memory-limit", "1GiB", "--no-pair"))
    assert line == ("error: --memory-limit: the config's micro-batch of 512 images (batch 1024 / subdivisions 2) "
                    "beside a step of 4096 images a device (the largest row's) needs 1150 MiB (its measured peak and "
                    "a 15% margin), over 1024 MiB: raise subdivisions, or set subdivisions=auto to plan it, or give "
                    "smaller --batches")
    assert asked == [(512, 4096)]  # that micro-batch alone, beside the largest row's step (the default rows: x1/4..x4)


def test_the_micro_batch_is_measured_beside_the_largest_rows_step(monkeypatch):
    """On the CPU and on unified memory a run holds its whole step's data, so a row at batch 8192 on one device needs
    more than the config's batch of 1024 at the same micro-batch: the stand-in's peak is 1,000 MiB + 1/8 MiB an image
    of the step, 1,128 MiB x 1.15 = 1,297 at the config's step (under 2 GiB: once vouched for) and 2,024 x 1.15 =
    2,328 at the largest row's (over). The memory plan of ``subdivisions: auto`` measures beside that step too."""
    asked: list[tuple[int, int]] = []

    def measure(cfg, micro_batch, per_device):
        asked.append((micro_batch, per_device))
        return Measurement(micro_batch, int((1000 + per_device / 8) * MiB), 1.0)

    monkeypatch.setattr(planner, "measure", measure)
    monkeypatch.setattr(command, "measure", lambda *args: pytest.fail("measured past the limit"))
    args = ("plan", "digits", "--set", "batch=1024", "subdivisions=2", "--devices", "1,2", "--batches", "1024,8192",
            "--memory-limit", "2GiB", "--no-pair")
    line = one_error_line(run_main(*args))
    assert line == ("error: --memory-limit: the config's micro-batch of 512 images (batch 1024 / subdivisions 2) "
                    "beside a step of 8192 images a device (the largest row's) needs 2328 MiB (its measured peak and "
                    "a 15% margin), over 2048 MiB: raise subdivisions, or set subdivisions=auto to plan it, or give "
                    "smaller --batches")
    assert asked == [(512, 8192)]  # 8192 / 1 device
    asked.clear()
    one_error_line(run_main("plan", "digits", "--set", "batch=1024", "subdivisions=auto", "--devices", "1,2",
                            "--batches", "1024,8192", "--memory-limit", "1GiB", "--no-pair"))  # none fits 1 GiB
    assert asked and {per_device for _, per_device in asked} == {8192}


def test_out_of_memory_in_the_advisors_measurement_is_one_line_naming_subdivisions(monkeypatch):
    """The limit holds (1,150 MiB planned, 2 GiB given), and the measurement then runs out of device memory: one line
    naming ``subdivisions``, not torch's traceback; without a limit, the line also names ``--memory-limit``."""
    stand_in_measurements(monkeypatch, 1000)

    def out_of_memory(cfg, micro_batch, steps):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    monkeypatch.setattr(command, "measure", out_of_memory)
    args = ("plan", "digits", "--set", "batch=1024", "subdivisions=2", "--devices", "1", "--no-pair")
    line = one_error_line(run_main(*args, "--memory-limit", "2GiB"))
    assert line == ("error: subdivisions: out of memory measuring micro-batches of up to 512 images (CUDA out of "
                    "memory. Tried to allocate 2.00 GiB); raise subdivisions, set subdivisions=auto")
    assert one_error_line(run_main(*args)).endswith("set subdivisions=auto or give --memory-limit to have it "
                                                    "checked first")


def test_a_run_whose_batch_schedule_changed_its_batch_is_refused_as_an_adaptive_one_is(tmp_path):
    """Its config's ``batch`` is only the first phase's: S_min from its steps at that batch would be 2.6x low for a
    run at 4x its batch from step 20 of 150 (B_noise 300)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: digits\nbatch: 64\nschedule:\n  batch:\n  - {at: 20, factor: 4}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 100, "lr": 0.1, "loss": 0.8, "noise_scale": 300.0}, {"step": 150, "lr": 0.1, "loss": 0.5})))
    line = one_error_line(run_main("plan", "digits", "--devices", "2", "--from", str(run), "--target-loss", "0.5"))
    assert line == (f"error: --from: {run / 'config.yaml'} has no fixed global batch (its schedule.batch changes the "
                    "batch during the run: its steps were not all taken at one batch)")
    (run / "config.yaml").write_text("name: digits\nbatch: 64\nschedule:\n  batch: []\n")  # no phases: one batch
    from bigbatch.advisor.from_run import reached

    assert reached(run, 0.5).batch == 64


def test_a_runs_config_yaml_is_read_by_bigbatchs_loader(tmp_path):
    """``plan --from RUN`` read the run's config.yaml with PyYAML's own safe_load, where a key given twice keeps its
    last value without a word; bigbatch's loader (``config.loading.load_yaml``) refuses it, as for any config."""
    from bigbatch.advisor.from_run import reached
    from bigbatch.errors import UserError

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 100, "lr": 0.1, "loss": 0.5}) + "\n")
    (run / "config.yaml").write_text("name: digits\nbatch: 64\n")
    assert reached(run, 0.5).batch == 64
    (run / "config.yaml").write_text("name: digits\nbatch: 64\nbatch: 128\n")
    with pytest.raises(UserError, match=r"--from: .*config\.yaml is not a config bigbatch reads \(key 'batch' given "
                                        r"twice\)"):
        reached(run, 0.5)


# --- a unified-memory GPU (Jetson): the host's memory and the device's are the same RAM ------------------------------

def unified_machine(monkeypatch, tmp_path, unified: bool = True) -> None:
    """A machine with CUDA whose ``/proc/meminfo`` has (``unified``) or lacks ``NvMapMemUsed``, the line a Jetson's
    kernel writes (``telemetry/memory.py``)."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  8000000 kB\n" + ("NvMapMemUsed:  204800 kB\n" if unified else ""))
    monkeypatch.setattr(memory, "MEMINFO", meminfo)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_a_gpu_with_nvmap_memory_is_planned_as_unified_memory(monkeypatch, tmp_path):
    unified_machine(monkeypatch, tmp_path)
    assert planner.unified_memory()
    assert planner.host_counts(torch.device("cuda", 0)) and planner.host_counts(torch.device("cpu"))
    unified_machine(monkeypatch, tmp_path, unified=False)  # a discrete GPU: its own memory only
    assert not planner.unified_memory()
    assert not planner.host_counts(torch.device("cuda", 0)) and planner.host_counts(torch.device("cpu"))


def test_on_unified_memory_the_peak_is_the_host_rss_plus_the_cuda_reserved_peak(monkeypatch, tmp_path):
    """The measuring process reports both parts (``_main``), and the parent adds the larger of its RSS and the RSS
    ``wait4`` read at its end to the CUDA allocator's reserved peak; on a discrete GPU the reserved peak alone."""
    unified_machine(monkeypatch, tmp_path)
    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=600 * 1024))  # KiB: 600 MiB
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 300 * MiB)
    cuda = torch.device("cuda", 0)
    assert planner.peak_parts(cuda, planner.host_counts(cuda)) == (600 * MiB, 300 * MiB)

    cfg = load_config("digits", ["batch=64", "subdivisions=2"])
    monkeypatch.setattr(planner, "measure_in_this_process",
                        lambda cfg, micro, per_device: Measurement(micro, 900 * MiB, 10.0, device_bytes=300 * MiB))
    out = io.StringIO()
    with redirect_stdout(out):
        planner._main([json.dumps(cfg.model_dump(mode="json")), "4", "64"])
    reported = json.loads(out.getvalue())
    assert reported == {"micro_batch": 4, "images_per_s": 10.0, "host": True, "host_bytes": 600 * MiB,
                        "device_bytes": 300 * MiB}
    assert planner.whole_peak(reported, exit_rss=700 * MiB) == 1000 * MiB  # the RSS at its end was higher
    assert planner.whole_peak(reported, exit_rss=500 * MiB) == 900 * MiB

    unified_machine(monkeypatch, tmp_path, unified=False)
    assert planner.peak_parts(cuda, planner.host_counts(cuda)) == (0, 300 * MiB)
    discrete = {"micro_batch": 4, "images_per_s": 10.0, "host": False, "host_bytes": 0, "device_bytes": 300 * MiB}
    assert planner.whole_peak(discrete, exit_rss=700 * MiB) == 300 * MiB  # the host's data does not count


def test_on_unified_memory_the_budget_is_the_hosts_available_memory_not_the_devices_free(monkeypatch, tmp_path):
    import psutil

    unified_machine(monkeypatch, tmp_path)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=6000 * MiB))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *args: pytest.fail("the device's free memory read"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert planner.default_budget(load_config("digits", [])) == 5400 * MiB // 2  # 90 %, shared by 2 processes
