"""``bigbatch report``: the HTML page of real runs and of hand-made run directories (whose numbers are known), the
files it refuses to overwrite, and, where a Chromium is installed, the page as a browser draws it."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bigbatch.errors import UserError
from bigbatch.report import charts, write_report
from bigbatch.report.runs import read_run, read_runs
from tests.helpers import HANG_GUARD_S, StopAfter, run_main, torchrun

SETTINGS = ["data.size=8", "model.width=4", "subdivisions=2", "steps=6", "eval.every=2", "log.every=2",
            "log.tensorboard=false", "memory.interval=0.05"]
SECTIONS = ("runs", "loss", "evaluation", "throughput", "phases", "updates", "noise", "advisor", "scale", "memory")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two real digits runs, batch 64 and 128, 6 steps each."""
    root = tmp_path_factory.mktemp("runs")
    runs = []
    for batch in (64, 128):
        out = root / f"b{batch}"
        result = run_main("train", "digits", "--out", str(out), "--set", *SETTINGS, f"batch={batch}",
                          f"name=report-b{batch}")
        assert result.returncode == 0, result.stderr
        runs.append(out)
    return runs[0], runs[1]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def section(html: str, anchor: str) -> str:
    start = html.index(f'<section id="{anchor}">')
    return html[start:html.index("</section>", start)]


def external_urls(html: str) -> list[str]:
    """Every http(s) URL but the two XML namespaces an inline SVG declares (nothing is fetched for them)."""
    allowed = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
    return [url for url in re.findall(r"https?://[^\s\"'<>)]+", html) if url not in allowed]


class Tags(HTMLParser):
    """Counts start and end tags: the page parses, and every ``svg``, ``section``, ``details`` is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: dict[str, int] = {}
        self.closed: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        self.opened[tag] = self.opened.get(tag, 0) + 1

    def handle_endtag(self, tag):
        self.closed[tag] = self.closed.get(tag, 0) + 1


def test_a_report_of_two_runs(two_runs, tmp_path):
    small, big = two_runs
    out = write_report([small, big], tmp_path / "two.html")
    assert out == tmp_path / "two.html"
    html = out.read_text(encoding="utf-8")
    assert "report-b64" in html and "report-b128" in html
    for anchor in SECTIONS:
        assert f'<section id="{anchor}">' in html
    for anchor in ("loss", "evaluation", "throughput", "updates", "noise"):
        assert "<svg" in section(html, anchor), anchor
    samples = max(len((run / "memory.csv").read_text().splitlines()) - 1 for run in two_runs)
    assert ("<svg" in section(html, "memory")) == (samples >= charts.MIN_POINTS)  # fewer: a table of them
    assert section(html, "loss").count("<svg") == 2  # loss, then the learning rate
    assert section(html, "updates").count("<svg") == 2  # a heatmap a run
    # the config, as the run wrote it, in a collapsible block
    assert "<summary>config.yaml" in html and "name: report-b128" in html
    assert external_urls(html) == []
    tags = Tags()
    tags.feed(html)
    for tag in ("svg", "section", "details", "table", "figure"):
        assert tags.opened.get(tag, 0) == tags.closed.get(tag, 0), tag
    assert tags.opened["svg"] >= 8
    # the numbers of the header, against the runs' own records: images seen = 6 steps x batch, the last loss
    summary = section(html, "runs")
    for run, batch in ((small, 64), (big, 128)):
        last = [r for r in records(run) if "lr" in r][-1]
        assert last["images"] == 6 * batch
        assert f"<td>{6 * batch:,}</td>" in summary
        assert f"<td>{last['loss']:.4g}</td>" in summary
    # light: a few hundred KB at most for two short runs
    assert out.stat().st_size < 1_000_000
    assert [p.name for p in tmp_path.iterdir()] == ["two.html"]  # no temporary file left behind


def test_the_phase_breakdown_where_the_runs_recorded_it(two_runs, tmp_path):
    html = write_report(list(two_runs), tmp_path / "r.html").read_text(encoding="utf-8")
    measured = [r for r in records(two_runs[0]) if "lr" in r and "t_forward" in r]
    if measured:
        assert "<svg" in section(html, "phases") and "s / step" in section(html, "phases")
    else:
        assert "No run recorded phase times" in section(html, "phases")


def test_one_run_is_reported_in_its_folder_and_a_report_replaces_its_own(two_runs):
    small = two_runs[0]
    out = write_report([small], None)
    assert out == small / "report.html"
    first = out.read_text(encoding="utf-8")
    assert "report-b64" in first and "report-b128" not in first
    assert write_report([small], None) == out  # a report written here may be replaced
    assert not [p for p in small.iterdir() if p.name.endswith(".tmp")]


def test_several_runs_are_reported_in_the_current_folder(two_runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = write_report(list(two_runs), None)
    assert out.resolve() == (tmp_path / "report.html").resolve() and out.is_file()


def test_a_file_it_did_not_write_is_not_overwritten(two_runs, tmp_path):
    foreign = tmp_path / "notes.html"
    foreign.write_text("<html><body>my notes</body></html>")
    with pytest.raises(UserError, match=re.escape(str(foreign))):
        write_report([two_runs[0]], foreign)
    assert foreign.read_text() == "<html><body>my notes</body></html>"
    with pytest.raises(UserError, match="is a folder"):
        write_report([two_runs[0]], tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        write_report([two_runs[0]], tmp_path / "absent" / "r.html")


def test_a_page_carrying_the_generator_tag_is_not_overwritten_without_a_record(two_runs, tmp_path):
    """The generator meta tag proves nothing: a user's page quoting it (or an edited copy of a report) is kept; only
    a report bigbatch recorded as it wrote it, unchanged since, is replaced."""
    notes = tmp_path / "mynotes.html"
    mine = '<html><head><meta name="generator" content="bigbatch report 1.0"></head><body>my text</body></html>'
    notes.write_text(mine)
    with pytest.raises(UserError, match=r"--out: .*mynotes\.html looks like a report but bigbatch has no record"):
        write_report([two_runs[0]], notes)
    assert notes.read_text() == mine
    out = write_report([two_runs[0]], tmp_path / "r.html")
    assert write_report([two_runs[0]], out) == out  # recorded as written: replaced
    out.write_text(out.read_text(encoding="utf-8") + "<!-- my note -->", encoding="utf-8")  # edited since
    edited = out.read_bytes()
    with pytest.raises(UserError, match="no record"):
        write_report([two_runs[0]], out)
    assert out.read_bytes() == edited


def test_a_failed_write_leaves_the_previous_report(two_runs, tmp_path, monkeypatch):
    out = write_report([two_runs[0]], tmp_path / "r.html")
    before = out.read_bytes()

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(UserError, match="cannot write in .*No space left on device"):  # one line, not OSError
        write_report(list(two_runs), out)
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_a_folder_that_is_not_a_run_is_one_clear_error(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(UserError) as error:
        write_report([folder], tmp_path / "r.html")
    message = str(error.value)
    assert str(folder) in message and "config.yaml" in message and "metrics.jsonl" in message
    assert "\n" not in message
    with pytest.raises(UserError, match="does not exist"):
        write_report([tmp_path / "nowhere"], tmp_path / "r.html")
    with pytest.raises(UserError, match="at least one"):
        write_report([], tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists() and not (folder / "report.html").exists()


def test_a_run_with_metrics_only_still_reports(two_runs, tmp_path):
    bare = tmp_path / "crashed"
    bare.mkdir()
    text = (two_runs[1] / "metrics.jsonl").read_text()
    (bare / "metrics.jsonl").write_text(text + '{"step": 7, "images": 89')  # killed while writing its last line
    html = write_report([bare], None).read_text(encoding="utf-8")
    cards = section(html, "runs")
    assert "config.yaml, memory.csv, updates.csv" in cards  # said to be absent
    assert "1 line(s) not a bigbatch record" in cards
    assert "<svg" in section(html, "loss") and "<svg" in section(html, "noise")
    assert "No run has a memory.csv" in section(html, "memory")
    # without updates.csv, the heatmap is drawn from the records' ten largest updates
    assert "updates.csv is absent" in section(html, "updates")
    # the batch comes from the records (images = step x batch) when there is no config
    assert read_run(bare).batch == 128


# --- hand-made run directories, whose numbers are known ------------------------------------------------------------

def make_run(folder: Path, train: list[dict], config: str | None = "name: made\nbatch: 100\nsubdivisions: 4\n",
             events: tuple[dict, ...] = (), memory: list[dict] | None = None) -> Path:
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.yaml").write_text(config)
    lines = [json.dumps({"images": r["step"] * 100, "lr": 0.1, "loss": 1.0, **r}) for r in train]
    lines += [json.dumps(e) for e in events]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if memory is not None:
        with open(folder / "memory.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(memory[0]))
            writer.writeheader()
            writer.writerows(memory)
    return folder


def test_phase_shares_are_the_means_over_the_records_but_the_first(tmp_path):
    """Step 1 warms up and is left out (as the run's own table does); steps 2 and 3 average to data 0.1, forward
    0.3, backward 0.4, sync 0, update 0.1, other 0.1 of a 1.0 s step: shares 10/30/40/0/10/10 %."""
    phases = ("t_data", "t_forward", "t_backward", "t_sync", "t_update", "t_other")
    rows = [(9.0, 9.0, 9.0, 0.0, 9.0, 9.0), (0.05, 0.2, 0.5, 0.0, 0.15, 0.1), (0.15, 0.4, 0.3, 0.0, 0.05, 0.1)]
    train = [{"step": s + 1, **dict(zip(phases, row, strict=True)), "t_step": sum(row)} for s, row in enumerate(rows)]
    run = make_run(tmp_path / "timed", train)
    means, count = read_run(run).phase_means()
    assert count == 2
    expected = {"data": 0.1, "forward": 0.3, "backward": 0.4, "sync": 0.0, "update": 0.1, "other": 0.1, "step": 1.0}
    assert means == pytest.approx(expected)
    html = write_report([run], None).read_text(encoding="utf-8")
    table = section(html, "phases")
    for phase, share in (("data", "10.0"), ("forward", "30.0"), ("backward", "40.0"), ("update", "10.0")):
        assert re.search(rf'<td class="text">{phase}</td><td>[0-9.]+</td><td>{share} %</td>', table), phase
    assert "<svg" in table


def test_the_bn_all_reduce_is_a_row_inside_the_step_not_a_phase_of_it(tmp_path):
    timed = {"t_data": 0.1, "t_forward": 0.4, "t_backward": 0.4, "t_sync": 0.0, "t_update": 0.1, "t_other": 0.0,
             "t_step": 1.0}
    train = [{"step": s, **timed, **({"t_bn_sync": 0.25} if s > 2 else {})} for s in (1, 2, 3, 4)]  # a resumed
    # run whose first records were made before t_bn_sync: the mean is over the records that have it
    means, _ = read_run(make_run(tmp_path / "synced", train)).phase_means()
    assert means["bn_sync"] == pytest.approx(0.25) and means["step"] == pytest.approx(1.0)
    table = section(write_report([tmp_path / "synced"], None).read_text(encoding="utf-8"), "phases")
    assert re.search(r"of which BN all-reduce</i></td><td>0.2500</td><td>25.0 %</td>", table)
    plain = make_run(tmp_path / "plain", [{"step": s, **timed} for s in (1, 2)])
    assert "BN all-reduce" not in section(write_report([plain], None).read_text(encoding="utf-8"), "phases")


@pytest.mark.parametrize(("layers", "every"), [(8, 1), (20, 1), (33, 1), (61, 1), (79, 1), (80, 2), (200, 3)])
def test_every_row_of_the_update_heatmap_is_named_while_the_names_fit(tmp_path, layers, every):
    run = make_run(tmp_path / f"l{layers}", [{"step": s} for s in (1, 2)])
    with open(run / "updates.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "name", "max_abs", "relative"])
        writer.writerows([step, f"layer{i:03d}.weight", 0.01, 0.001 * (i + 1)] for step in (1, 2)
                         for i in range(layers))
    heatmap = section(write_report([run], None).read_text(encoding="utf-8"), "updates")
    named = [i for i in range(layers) if f"layer{i:03d}.weight" in heatmap]
    assert named == list(range(0, layers, every))


def test_records_without_t_other_count_the_rest_of_the_step_as_other(tmp_path):
    train = [{"step": 1, "t_data": 0.1, "t_forward": 0.2, "t_backward": 0.3, "t_update": 0.1, "t_step": 1.0}]
    means, _ = read_run(make_run(tmp_path / "older", train)).phase_means()
    assert means["other"] == pytest.approx(0.3) and means["sync"] == 0.0


def test_loss_scale_skipped_steps_and_memory_columns(tmp_path):
    train = [{"step": s, "loss_scale": 2.0 ** (16 - (s > 2)), "skipped": int(s > 2)} for s in (1, 2, 3, 4)]
    zero = {"cuda_allocated_mib": 0.0}
    memory = [{"time": 1000 + 5 * i, "elapsed_s": 5 * i, "step": i, "rss_mib": 800 + i, **zero, "npu_mib": 7 * i}
              for i in range(4)]
    run = make_run(tmp_path / "scaled", train, memory=memory,
                   events=({"step": 2, "event": "skipped", "skipped": 1, "loss_scale": 32768.0, "nonfinite": "fc"},))
    html = write_report([run], None).read_text(encoding="utf-8")
    assert "<svg" in section(html, "scale")
    plotted = section(html, "memory")
    assert "rss (MiB)" in plotted and "npu (MiB)" in plotted  # a column added later is plotted too
    assert "cuda allocated (MiB)" not in plotted  # all zero: left out
    assert "nonfinite fc" in section(html, "runs")  # the event, in the run's table of events
    # a run without any of these says so rather than drawing an empty chart
    quiet = write_report([make_run(tmp_path / "quiet", [{"step": 1, "skipped": 0}])], None).read_text()
    assert "No loss scale recorded and no step skipped" in section(quiet, "scale")


def test_runs_in_folders_of_the_same_name_get_distinct_labels(tmp_path):
    a = make_run(tmp_path / "a" / "run", [{"step": 1}])
    b = make_run(tmp_path / "b" / "run", [{"step": 1}])
    assert [run.label for run in read_runs([a, b])] == ["a/run", "b/run"]
    assert [run.label for run in read_runs([a, a])] == ["a/run #1", "a/run #2"]


def test_text_from_the_run_is_escaped(tmp_path):
    run = make_run(tmp_path / "odd", [{"step": 1}], config="name: <script>alert(1)</script>\nbatch: 10\n")
    html = write_report([run], None).read_text(encoding="utf-8")
    assert "<script>" not in html and "&lt;script&gt;" in html


# --- the page in a browser -----------------------------------------------------------------------------------------

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless_shell")


def test_a_browser_draws_the_page(two_runs, tmp_path):
    browser = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    if browser is None:
        pytest.skip("no Chromium installed: the browser check needs one from the system's packages")
    report = write_report(list(two_runs), tmp_path / "report.html")
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
              "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
              "--disable-dev-shm-usage",
              f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,6000"]  # a page that fetches nothing
    screenshot = tmp_path / "report.png"
    shot = subprocess.run([*common, f"--screenshot={screenshot}", report.as_uri()], capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert shot.returncode == 0, shot.stderr
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn_in(screenshot, charts.colour(0)) > 500 and drawn_in(screenshot, charts.colour(1)) > 500, \
        "both runs' lines are drawn on the page"
    dom = subprocess.run([*common, "--dump-dom", report.as_uri()], capture_output=True, text=True,
                         timeout=HANG_GUARD_S)
    assert dom.returncode == 0, dom.stderr
    for anchor in SECTIONS:
        assert f'id="{anchor}"' in dom.stdout
    assert dom.stdout.count("<svg") >= 8 and "report-b64" in dom.stdout and "report-b128" in dom.stdout


def drawn_in(png: Path, colour: str) -> int:
    """Pixels of ``colour`` (#rrggbb, within 24 per channel: anti-aliasing) in the screenshot."""
    import numpy as np
    from PIL import Image

    target = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    with Image.open(png) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.int16)
    return int((np.abs(pixels - target) <= 24).all(axis=-1).sum())


def test_the_cli_writes_the_report(two_runs, tmp_path, capsys):
    from bigbatch.cli import main

    out = tmp_path / "both.html"
    assert main(["report", *map(str, two_runs), "--out", str(out)]) == 0
    assert f"report written to {out}" in capsys.readouterr().out
    assert out.read_text().count("<svg") >= 5
    assert main(["report", str(tmp_path / "absent")]) == 2


# --- the world size and the restarts, as the run records them --------------------------------------------------------

def segments(run: Path) -> list[dict]:
    return [r for r in records(run) if r.get("event") in ("started", "resumed")]


def test_a_run_records_its_world_size_and_the_report_shows_it(two_runs, tmp_path):
    small = two_runs[0]
    started = segments(small)
    assert len(started) == 1 and started[0]["step"] == 0 and started[0]["world"] == 1
    assert records(small)[0] == started[0]  # the first line of the file: before any step
    run = read_run(small)
    assert run.world == 1 and run.worlds == [(0, 1)] and run.restarts == []
    html = write_report([small], tmp_path / "r.html").read_text(encoding="utf-8")
    assert "world size is not recorded" not in html
    assert "micro-batch 32 on 1 process" in section(html, "runs")  # 64 / (1 x 2)
    assert "restart-" not in html  # a run never interrupted: nothing marked


def test_a_run_resumed_on_another_world_size_records_each(tmp_path):
    """Two processes under torchrun for two steps, resumed on one for a third: each start says its world size."""
    out = tmp_path / "moved"
    launched = torchrun(out, "steps=2", "checkpoint.every=1", "memory.interval=0.2")
    assert launched.returncode == 0, launched.stderr[-3000:]
    resumed = run_main("train", "--resume", str(out), "--set", "steps=3")
    assert resumed.returncode == 0, resumed.stderr
    # it had got to step 2, its checkpoint's: nothing redone; on 1 process, the micro-batch of 4 is kept
    assert [(r["event"], r["step"], r["world"], r.get("stopped_at"), r["subdivisions"], r["micro_batch"])
            for r in segments(out)] == [("started", 0, 2, None, 8, 4), ("resumed", 2, 1, 2, 16, 4)]
    assert "resuming on 1 process (the checkpoint's run: 2): subdivisions 16, micro-batch 4 (kept)" in resumed.stdout
    run = read_run(out)
    assert run.worlds == [(0, 2), (2, 1)] and run.world == 1
    html = write_report([out], None).read_text(encoding="utf-8")
    runs = section(html, "runs")
    assert "2, then 1 from step 2" in runs and "<td>2 → 1</td>" in runs
    assert "micro-batch 4 on 1 process (from step 2)" in runs  # batch 64: the digits recipe's 8 subdivisions x 2
    assert "resumed at step 2 (it had got to step 2) on 1 process" in runs
    assert 'id="c' in section(html, "loss") and "restart-0-0" in section(html, "loss")
    assert "redone-0-0" not in section(html, "loss")  # no step was run twice


def test_an_interrupted_run_resumed_is_marked_where_it_restarted(tmp_path):
    """Stopped (KeyboardInterrupt, as Ctrl-C) after step 5 with its last checkpoint at step 4, then resumed: the
    resume is recorded at step 4 with the step the run had got to, and the charts over steps, images seen and time
    mark it."""
    from bigbatch.registry import HOOKS

    out = tmp_path / "stopped"
    settings = ["data.size=8", "model.width=4", "subdivisions=2", "batch=64", "steps=8", "eval.every=2", "log.every=1",
                "checkpoint.every=2", "log.tensorboard=false", "memory.interval=0.2"]
    HOOKS.register("stop_after_5", lambda run: StopAfter(5))
    try:
        stopped = run_main("train", "digits", "--out", str(out), "--set", *settings)
    finally:
        HOOKS.unregister("stop_after_5")
    assert stopped.returncode == 130
    resumed = run_main("train", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(f"resumed from step 4 of 8 ({out / 'checkpoints' / 'last.pt'})\n")
    assert "running on 1 process; the run before had recorded up to step 5" in resumed.stdout
    assert [(r["event"], r["step"], r.get("stopped_at")) for r in segments(out)] == \
        [("started", 0, None), ("resumed", 4, 5)]
    train_steps = [r["step"] for r in records(out) if "lr" in r]
    assert train_steps == list(range(1, 9))  # the records past the checkpoint were dropped, as before

    run = read_run(out)
    assert [(r.step, r.stopped_at, r.world, r.source) for r in run.restarts] == [(4, 5, 1, "metrics.jsonl")]
    memory_csv = (out / "memory.csv").read_text()
    assert len(run.memory_breaks) == 1, memory_csv  # memory.csv's clock starts again there too
    before, after = run.memory_breaks[0]
    assert 0 <= before < after
    html = write_report([out], None).read_text(encoding="utf-8")
    for anchor in ("loss", "evaluation", "throughput", "noise", "updates"):
        assert "restart-0-0" in section(html, anchor), anchor
        assert "redone-0-0" in section(html, anchor), anchor  # step 5 was run twice
    assert "restart-0-0" in section(html, "memory") and "redone-0-0" in section(html, "memory")
    assert "resumed at step 4 (it had got to step 5) on 1 process" in section(html, "runs")

    # the same run directory as a version before the start records left it: memory.csv says where it restarted
    old = tmp_path / "old"
    shutil.copytree(out, old)
    (old / "report.html").unlink()  # a copy of a report is not one bigbatch recorded writing: it would be kept
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (old / "metrics.jsonl").write_text("\n".join(line for line in lines if '"event": "started"' not in line
                                                 and '"event": "resumed"' not in line) + "\n")
    run = read_run(old)
    assert run.world is None and [(r.step, r.stopped_at, r.source) for r in run.restarts] == [(4, 5, "memory.csv")]
    html = write_report([old], None).read_text(encoding="utf-8")
    assert "world size is not recorded" in html
    assert "restart-0-0" in section(html, "loss") and "resumed at step 4 (it had got to step 5)" in html


def test_restarts_of_hand_made_run_directories(tmp_path):
    """Where the restarts come from: the start records first; else memory.csv's clock going back; else training
    records going back to an earlier step; a run with none of these is drawn without a mark."""
    events = ({"step": 0, "event": "started", "world": 2, "time": 1000.0},
              {"step": 3, "event": "resumed", "world": 4, "time": 1600.0, "stopped_at": 5})
    recorded = read_run(make_run(tmp_path / "recorded", [{"step": s} for s in range(1, 9)], events=events))
    assert recorded.worlds == [(0, 2), (3, 4)] and recorded.world == 4
    assert [(r.step, r.stopped_at, r.world, r.time) for r in recorded.restarts] == [(3, 5, 4, 1600.0)]
    assert read_run(tmp_path / "recorded").batch == 100  # micro-batch: 100 / (4 x 4)
    assert "micro-batch 6.25 on each of 4 processes (from step 3)" in \
        section(write_report([tmp_path / "recorded"], None).read_text(encoding="utf-8"), "runs")

    memory = [{"time": 1000 + 60 * i, "elapsed_s": 60 * i, "step": 2 * i, "rss_mib": 800.0} for i in range(4)]
    memory += [{"time": 1600 + 60 * i, "elapsed_s": 60 * i, "step": 4 + 2 * i, "rss_mib": 800.0} for i in range(3)]
    clocked = read_run(make_run(tmp_path / "clocked", [{"step": s} for s in range(1, 9)], memory=memory))
    assert [(r.step, r.stopped_at, r.source) for r in clocked.restarts] == [(4, 6, "memory.csv")]
    assert clocked.memory_breaks == [(3.0, 10.0)]  # minutes: the last sample before, the first after

    repeated = read_run(make_run(tmp_path / "repeated", [{"step": s} for s in (1, 2, 3, 4, 5, 3, 4, 5, 6)]))
    assert [(r.step, r.stopped_at, r.source) for r in repeated.restarts] == [(2, 5, "training records")]

    plain = make_run(tmp_path / "plain", [{"step": s} for s in range(1, 9)])
    assert read_run(plain).restarts == []
    assert "restart-" not in write_report([plain], None).read_text(encoding="utf-8")


# --- too few points to draw ---------------------------------------------------------------------------------------

def test_a_detection_run_evaluated_once_shows_its_metrics_as_a_table_not_charts(tmp_path):
    data = tmp_path / "shapes"
    made = run_main("data", "shapes", "--out", str(data), "--images", "30", "--seed", "3")
    assert made.returncode == 0, made.stderr
    out = tmp_path / "det"
    trained = run_main("train", "shapes-detect", "--out", str(out), "--set", f"data.path={data}", "steps=3",
                       "eval.every=3", "log.every=1", "log.tensorboard=false", "memory.interval=0.2")
    assert trained.returncode == 0, trained.stderr[-3000:]
    evaluation = [r for r in records(out) if r.get("split") == "val"]
    assert len(evaluation) == 1
    html = write_report([out], None).read_text(encoding="utf-8")
    evaluated = section(html, "evaluation")
    assert "<svg" not in evaluated and "The run was evaluated once" in evaluated
    for metric in ("mAP", "mAP50", "mAP75", "mAP_small", "AR100"):  # every metric in the table, with its value
        assert f"<th>{metric}</th>" in evaluated
    row = evaluated[evaluated.index("<tbody>"):]
    for metric in ("mAP", "mAP50", "AR100"):
        value = evaluation[0][metric]
        cell = f"<td>{value:.0f}</td>" if value == int(value) else f"<td>{value:.4g}</td>"
        assert cell in row, metric
    assert "<svg" in section(html, "loss")  # three training records: drawn


def test_series_of_too_few_points_are_tables(tmp_path):
    """A run of one training record, one evaluation and two memory samples: tables of the values, no chart; beside
    a run of many points, the same metrics are drawn (the short run's point among the other's lines)."""
    memory = [{"time": 1000 + 5 * i, "elapsed_s": 5 * i, "step": i, "rss_mib": 800.0 + i} for i in range(2)]
    short = make_run(tmp_path / "short", [{"step": 1, "loss": 2.25, "images_per_s": 123.0}], memory=memory,
                     events=({"step": 1, "split": "val", "top1": 12.5},))
    html = write_report([short], None).read_text(encoding="utf-8")
    for anchor in ("loss", "evaluation", "throughput", "memory"):
        assert "<svg" not in section(html, anchor), anchor
    # step, images seen, loss, lr
    assert re.search(r"<td>1</td><td>100</td><td>2.25</td><td>0.1</td>", section(html, "loss"))
    assert "<td>123</td>" in section(html, "throughput")
    assert "<td>12.5</td>" in section(html, "evaluation")
    assert "<td>800</td>" in section(html, "memory") and "<td>801</td>" in section(html, "memory")
    assert read_run(short).evals["val"]["top1"].count == 1

    twice = make_run(tmp_path / "twice", [{"step": s} for s in (1, 2, 3)],
                     events=({"step": 1, "split": "val", "top1": 10.0}, {"step": 3, "split": "val", "top1": 30.0}))
    evaluated = section(write_report([twice], None).read_text(encoding="utf-8"), "evaluation")
    assert "<svg" not in evaluated and "Every evaluation of the metrics too few to draw" in evaluated
    assert "<td>10</td>" in evaluated and "<td>30</td>" in evaluated

    long = make_run(tmp_path / "long", [{"step": s} for s in range(1, 7)],
                    events=tuple({"step": s, "split": "val", "top1": 10.0 * s} for s in range(1, 7)))
    both = write_report([short, long], tmp_path / "both.html").read_text(encoding="utf-8")
    assert "<svg" in section(both, "loss") and "<svg" in section(both, "evaluation")


def test_a_loss_scale_of_too_few_records_beside_skipped_steps_is_a_table(tmp_path):
    train = [{"step": s, "skipped": int(s > 2), **({"loss_scale": 65536.0} if s in (1, 4) else {})}
             for s in range(1, 5)]
    run = make_run(tmp_path / "skipping", train, events=({"step": 2, "event": "skipped", "skipped": 1},))
    scale = section(write_report([run], None).read_text(encoding="utf-8"), "scale")
    assert "<svg" in scale and "too few records of the loss scale to draw" in scale  # the skipped steps are drawn
    assert scale.count("<td>65,536</td>") == 2  # the two loss-scale records, in the table


def advisor_row(devices: int, batch: int, step: float, wall: float | None) -> dict:
    return {"devices": devices, "batch": batch, "step": step, "step_sd": step / 10, "images_per_s": batch / step,
            "wall_s": wall, "wall_sd": 0.2}


def test_the_advisor_chart_where_the_run_directory_holds_an_advisor_json(tmp_path):
    rows = [advisor_row(n, b, b / (100.0 * n), 1000.0 * (1 + 64 / b) * b / (100.0 * n)) for n in (1, 2)
            for b in (64, 128, 256)]
    planned = tmp_path / "planned"
    planned.mkdir()  # what bigbatch plan --devices --out writes, alone: a run directory of its own
    advice = {"bigbatch_advisor": 1, "rows": rows, "recommended": 5, "link": {"name": "nvlink"},
              "target": {"s_min": 1000.0}}
    (planned / "advisor.json").write_text(json.dumps(advice))
    run = read_run(planned)
    assert run.advice is not None and len(run.advice.rows) == 6 and not run.advice.relative
    assert (run.advice.recommended.devices, run.advice.recommended.batch) == (2, 256)
    assert run.advice.rows[0].images_per_s_sd == pytest.approx(100.0 / 10)  # step_sd / step of images/s
    html = write_report([planned], None).read_text(encoding="utf-8")
    advisor = section(html, "advisor")
    assert advisor.count("<svg") == 1 and "recommended: batch 256 on 2" in advisor
    assert "wall time to the target" in advisor and "link nvlink" in advisor
    # without a target the wall time is per S_min step; a row without its numbers is left out, said in a note
    relative = make_run(tmp_path / "relative", [{"step": 1}])
    (relative / "advisor.json").write_text(json.dumps({**advice, "target": {"s_min": None},
                                                       "rows": [*rows, {"devices": 4, "batch": "x"}]}))
    html = write_report([relative], None).read_text(encoding="utf-8")
    assert "wall time per S_min step" in section(html, "advisor")
    assert "1 of its 7 rows lack a number" in section(html, "runs")
    # a file of that name bigbatch did not write: a note, no chart
    other = make_run(tmp_path / "other", [{"step": 1}])
    (other / "advisor.json").write_text('{"advice": "buy more GPUs"}')
    html = write_report([other], None).read_text(encoding="utf-8")
    assert "No advisor.json in these runs" in section(html, "advisor")
    assert "advisor.json is not an advisor file bigbatch wrote" in section(html, "runs")
