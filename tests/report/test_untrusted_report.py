"""What ``bigbatch report`` and the YAML readers read is untrusted: a run folder's name or a metric's name is shown as
text (never as matplotlib mathtext), a ``metrics.jsonl`` of any length is read in memory that does not grow with it
(each curve a bounded number of points), and YAML alias expansion ("billion laughs") is bounded by a node count in
every YAML reader bigbatch has: the config loader, ``--set`` and the report's reader of run directories."""

from __future__ import annotations

import csv
import json
import math
import os
import random
import re
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bigbatch.cli import main
from bigbatch.config import (
    MAX_YAML_NODES,
    RECIPES_DIR,
    YAMLTooLarge,
    builtin_recipes,
    config_to_yaml,
    load_config,
    load_yaml,
)
from bigbatch.config import loading as config_loading
from bigbatch.report import charts, page, write_report
from bigbatch.report.runs import MAX_EVENTS, MAX_POINTS, MAX_RESTARTS, MAX_UPDATE_STEPS, Curve, read_runs


def section(html: str, anchor: str) -> str:
    start = html.index(f'<section id="{anchor}">')
    return html[start:html.index("</section>", start)]


def svg_texts(html: str) -> list[str]:
    """The text of every ``<text>`` element of the page's SVGs (``svg.fonttype: none`` keeps text as text), with
    XML's escapes undone."""
    from html import unescape

    return [unescape(t) for t in re.findall(r"<text\b[^>]*>([^<]*)</text>", html)]


def make_run(folder: Path, steps: int = 6, config: str | None = "batch: 100\nsubdivisions: 2\n",
             metric: str = "top1", layer: str = "fc.weight", column: str = "rss_mib") -> Path:
    """A small run: training records, an evaluation per step under ``metric``, memory.csv with ``column`` and
    updates.csv with ``layer``."""
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.yaml").write_text(config)
    lines = []
    for s in range(1, steps + 1):
        lines.append(json.dumps({"step": s, "images": 100 * s, "lr": 0.1, "loss": 2.0 / s, "images_per_s": 50.0 + s,
                                 "noise_scale": 40.0 + s}))
        lines.append(json.dumps({"step": s, "images": 100 * s, "split": "val", metric: 10.0 * s}))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with open(folder / "memory.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time", "elapsed_s", "step", column])
        writer.writerows([1000 + 5 * i, 5 * i, i, 800 + i] for i in range(steps))
    with open(folder / "updates.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "name", "max_abs", "relative"])
        writer.writerows([s, layer, 0.01, 0.001 * s] for s in range(1, steps + 1))
    return folder


# --- text from runs is text ------------------------------------------------------------------------------------

ODD = ("run $\\frac{a}{$", "$x$")
"""Folder names matplotlib would read as mathtext: the first stops the page (``ParseFatalException``), the second
would be drawn as an italic x."""


def test_names_with_dollars_are_shown_literally(tmp_path):
    runs = [make_run(tmp_path / ODD[0], metric="err $\\sqrt{$", layer="$w$.weight", column="$\\frac{$_mib"),
            make_run(tmp_path / ODD[1], metric="err $\\sqrt{$")]
    html = write_report(runs, tmp_path / "r.html").read_text(encoding="utf-8")
    texts = svg_texts(html)
    for name in ODD:  # each run's legend entry, in the loss chart, as the folder spells it
        assert f"{name} (batch 100)" in texts, name
        assert name in section(html, "runs")  # the HTML (escaped, but $ and \ stay as they are)
    assert "err $\\sqrt{$ vs steps" in svg_texts(section(html, "evaluation"))
    assert "$\\frac{$ (MiB)" in svg_texts(section(html, "memory"))
    assert "$w$.weight" in svg_texts(section(html, "updates"))
    assert f"{ODD[0]}: relative update per layer" in svg_texts(section(html, "updates"))
    assert not any("\\$" in text for text in texts), "the escapes that keep mathtext off are not shown"


def test_charts_show_text_as_text_whatever_the_callers_settings(tmp_path):
    import matplotlib

    runs = read_runs([make_run(tmp_path / ODD[0])])
    with matplotlib.rc_context({"text.usetex": True}):  # no LaTeX is run, nor needed
        svg = charts.loss(runs)
    assert f"{ODD[0]} (batch 100)" in svg_texts(svg)


def test_lines_no_json_reader_takes_are_skipped(tmp_path):
    """A 5,000-digit number (Python's int limit: ``ValueError``, not a ``JSONDecodeError``), a number past a float,
    a line nested past the recursion limit: each a skipped line, the rest of the run reported."""
    run = make_run(tmp_path / "hostile")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "lr": 0.1, "loss": 1' + "0" * 5000 + "}\n")
        f.write('{"step": 8, "lr": 0.1, "loss": 1' + "0" * 400 + "}\n")  # an int past a float: not a number
        f.write("[" * 100_000 + "\n")
    html = write_report([run], None).read_text(encoding="utf-8")
    assert "2 line(s) not a bigbatch record" in section(html, "runs")
    (data,) = read_runs([run])
    assert data.steps_done == 8 and data.series("loss")[0] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


# --- bounded memory, bounded points ----------------------------------------------------------------------------

def write_long_run(folder: Path, records: int) -> Path:
    """``records`` training records (loss = 1 / step), an evaluation every 10 steps, an event every 50, a
    memory.csv row a step, updates.csv every 5 steps: written with one format string, fast."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("batch: 8\n")
    with open(folder / "metrics.jsonl", "w") as f:
        for s in range(1, records + 1):
            f.write(f'{{"step": {s}, "images": {8 * s}, "lr": 0.1, "loss": {1.0 / s!r}}}\n')
            if s % 10 == 0:
                f.write(f'{{"step": {s}, "split": "val", "top1": {s / records!r}}}\n')
            if s % 50 == 0:
                f.write(f'{{"step": {s}, "event": "skipped", "skipped": {s // 50}}}\n')
    with open(folder / "memory.csv", "w") as f:
        f.write("time,elapsed_s,step,rss_mib\n")
        f.writelines(f"{1000 + s},{s},{s},{800 + s % 7}\n" for s in range(records))
    with open(folder / "updates.csv", "w") as f:
        f.write("step,name,max_abs,relative\n")
        f.writelines(f"{s},layer{i}.weight,0.01,0.001\n" for s in range(5, records + 1, 5) for i in range(2))
    return folder


def peak_of_reading(folder: Path) -> tuple[int, list]:
    tracemalloc.start()
    try:
        runs = read_runs([folder])
        return tracemalloc.get_traced_memory()[1], runs
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_file(tmp_path):
    n = 10_000  # past 2 x MAX_POINTS records: every curve has been thinned at least once
    read_runs([write_long_run(tmp_path / "warm", 100)])  # imports and first-use caches, before measuring
    small, _ = peak_of_reading(write_long_run(tmp_path / "small", n))
    large, (run,) = peak_of_reading(write_long_run(tmp_path / "large", 4 * n))
    size = (tmp_path / "large" / "metrics.jsonl").stat().st_size
    # holding the records (as the report did) costs several times the file: 4x the records, 4x the memory
    assert large < 1.3 * small + 256 * 1024, (small, large)
    assert large < size / 2, (large, size)
    # every curve at most MAX_POINTS points, the first and last step among them, each value the record's
    for name, curve in [*run.curves.items(), *run.evals["val"].items(), ("skips", run.skips)]:
        steps, _, values = curve.points()
        assert len(steps) <= MAX_POINTS and len(curve.steps) <= MAX_POINTS, name
        assert len(steps) >= MAX_POINTS // 4, name  # thinned, not emptied
        assert steps == sorted(set(steps)), name
    steps, images, losses = run.series("loss")
    assert (steps[0], steps[-1]) == (1, 4 * n)
    assert losses == [1.0 / s for s in steps] and images == [8.0 * s for s in steps]
    assert run.train_records == 4 * n and run.mean("loss") == pytest.approx(sum(1 / s for s in range(2, 4 * n + 1)) /
                                                                             (4 * n - 1))
    assert run.steps_done == 4 * n and run.images_seen == 8 * 4 * n
    assert len(run.events) == MAX_EVENTS and run.events_total == 4 * n // 50
    assert len(run.memory["minutes"]) <= MAX_POINTS and run.memory["step"][-1] == 4 * n - 1
    assert len(run.updates.steps) <= MAX_UPDATE_STEPS and run.updates.steps[-1] == 4 * n
    # and the charts draw at most charts.MAX_POINTS of them
    svg = charts.loss([run])
    assert svg is not None and len(svg) < 1_000_000


def test_restarts_kept_are_bounded(tmp_path):
    """A run resumed thousands of times (records of its starts, its memory clock starting again, its steps going
    back) keeps at most MAX_RESTARTS of each, and its page still draws."""
    folder = make_run(tmp_path / "restless")
    n = 3 * MAX_RESTARTS
    with open(folder / "metrics.jsonl", "a") as f:
        for k in range(n):
            f.write(json.dumps({"step": 4, "event": "resumed", "world": 1 + k % 3, "stopped_at": 6}) + "\n")
            for step in (5, 6):
                f.write(json.dumps({"step": step, "images": 100 * step, "lr": 0.1, "loss": 1.0}) + "\n")
    with open(folder / "memory.csv", "a", newline="") as f:
        csv.writer(f).writerows([2000 + k, k % 2, 1, 800] for k in range(2 * n))  # elapsed_s 0, 1, 0, 1, ...
    (run,) = read_runs([folder])
    assert len(run.segments) == len(run.clock_restarts) == len(run.record_restarts) == MAX_RESTARTS
    assert len(run.memory_breaks) <= MAX_RESTARTS and len(run.restarts) == MAX_RESTARTS
    assert charts.loss([run]) is not None


def spans(steps: list[int], stride: int) -> list[int]:
    """The thinning restated: the lowest step in each span [k x stride, (k + 1) x stride), and the highest."""
    lowest: dict[int, int] = {}
    for step in steps:
        lowest[step // stride] = min(step, lowest.get(step // stride, step))
    return sorted({*lowest.values(), max(steps)})


@pytest.mark.parametrize("steps", [list(range(1, 40_001)), list(range(1, 80_000, 2)),  # all odd
                                   list(range(391, 391 * 20_000, 391)), sorted(random.Random(0).sample(range(10**9),
                                                                                                     20_000))],
                         ids=["every", "odd", "every-391st", "random"])
def test_a_curve_thins_evenly_and_keeps_its_ends(steps):
    """Whatever the steps' spacing or offset, the kept points are spread over the steps (no gap much wider than
    the mean), the first and last are kept, and the order the points come in does not change which stay."""
    in_order, shuffled = Curve(), Curve()
    for step in steps:
        in_order.put(step, 2.0 * step, step / 7)
    for step in random.Random(1).sample(steps, len(steps)):
        shuffled.put(step, 2.0 * step, step / 7)
    kept, xs, values = in_order.points()
    assert MAX_POINTS // 2 <= len(kept) <= MAX_POINTS
    assert kept[0] == steps[0] and kept[-1] == steps[-1]
    assert xs == [2.0 * s for s in kept] and values == [s / 7 for s in kept]
    assert [int(s) for s in kept] == spans(steps, in_order.stride)
    assert shuffled.points() == (kept, xs, values)
    if steps[1] - steps[0] == steps[2] - steps[1]:  # evenly spaced steps: evenly spaced points
        gaps = [b - a for a, b in zip(kept, kept[1:], strict=False)]
        assert max(gaps) <= 2 * (kept[-1] - kept[0]) / (len(kept) - 1)
    assert in_order.count == len(steps) and in_order.low == (steps[0] / 7, steps[0])


# --- YAML alias expansion is bounded ---------------------------------------------------------------------------

def bomb(levels: int, prefix: str = "") -> str:
    """A "billion laughs" document: level 0 a list of ten strings, each next level a list of ten aliases of the one
    before: 10^levels strings once expanded, in a few hundred bytes."""
    lines = [f"{prefix}l0: &{prefix}l0 [" + ", ".join(['"lol"'] * 10) + "]"]
    for level in range(1, levels):
        lines.append(f"{prefix}l{level}: &{prefix}l{level} [" + ", ".join([f"*{prefix}l{level - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


FLOW_BOMB = "[&a [l, l, l, l, l, l, l, l, l, l], " + ", ".join(
    f"&{b} [" + ", ".join([f"*{a}"] * 10) + "]" for a, b in zip("abcde", "bcdef", strict=True)) + "]"
"""The same as one ``--set`` value: a million strings."""


def nodes(value: object) -> int:
    """The nodes of a value once expanded: a mapping or list is one, plus its keys and items."""
    if isinstance(value, dict):
        return 1 + sum(nodes(k) + nodes(v) for k, v in value.items())
    if isinstance(value, list):
        return 1 + sum(nodes(v) for v in value)
    return 1


def test_a_billion_laughs_is_refused_before_it_is_built():
    with pytest.raises(YAMLTooLarge, match=r"more than [\d,]+ YAML nodes"):
        load_yaml(bomb(9) + "name: *l8\n")  # 10^9 strings (1 KB of text)


@pytest.mark.parametrize("text", [
    "a: &a [1, 2]\nb: &b [*a, *a, {k: *a}]\nc: [*b, *b, *a]\n",  # aliases of nodes that hold aliases
    "x: &x {p: &p [1, [2, 3]], q: *p}\ny: [*x, *p, *x]\nz: &s 7\nw: [*s, *s]\n",  # an anchor inside an anchored node
    "[&l [a, b], [*l, [*l]], *l]\n",
])
def test_the_count_is_the_expanded_documents_nodes(monkeypatch, text):
    """The bound counts what the document expands to, nested anchors included: a bound of exactly that many nodes
    reads it, one less refuses it."""
    expanded = nodes(yaml.safe_load(text))
    monkeypatch.setattr(config_loading, "MAX_YAML_NODES", expanded)
    assert load_yaml(text) == yaml.safe_load(text)
    monkeypatch.setattr(config_loading, "MAX_YAML_NODES", expanded - 1)
    with pytest.raises(YAMLTooLarge):
        load_yaml(text)


def test_an_alias_inside_what_it_names_is_refused():
    with pytest.raises(YAMLTooLarge, match=r"\*a is inside what it names \(a cycle\)"):
        load_yaml("a: &a [1, *a]\n")
    with pytest.raises(YAMLTooLarge, match="cycle"):
        load_yaml("&m {k: [*m]}\n")


def test_the_bound_is_far_above_every_builtin_recipe():
    for recipe in builtin_recipes():
        resolved = yaml.safe_load(config_to_yaml(load_config(recipe)))  # the config.yaml a run writes
        assert 100 * nodes(resolved) < MAX_YAML_NODES, recipe
    for path in RECIPES_DIR.glob("*.yaml"):
        assert 100 * nodes(yaml.safe_load(path.read_text())) < MAX_YAML_NODES, path.name


def recipe_with(extra: str, tmp_path: Path) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text((RECIPES_DIR / "digits.yaml").read_text() + extra)
    return path


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err[:2000]
    assert len(lines[0]) < 300, lines[0][:300]  # the line names the problem, not the expanded value
    return lines[0]


@pytest.mark.parametrize("command", ["show", "train"])
def test_a_recipe_with_an_alias_bomb_is_one_error_line(tmp_path, capsys, command):
    path = recipe_with(bomb(6, prefix="x") + "model:\n  name: *xl5\n", tmp_path)  # a million strings
    out = tmp_path / "run"
    assert main([command, str(path), *(["--out", str(out)] if command == "train" else [])]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: config: {path}:") and "YAML nodes" in line
    assert not out.exists()


@pytest.mark.parametrize("value", [FLOW_BOMB, "&a [1, *a]"], ids=["bomb", "cycle"])
@pytest.mark.parametrize("command", ["show", "train"])
def test_a_set_value_with_an_alias_bomb_is_one_error_line(tmp_path, capsys, command, value):
    out = tmp_path / "run"
    assert main([command, "digits", "--set", f"model.name={value}",
                 *(["--out", str(out)] if command == "train" else [])]) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: --set: model.name: ") and ("YAML nodes" in line or "cycle" in line)
    assert not out.exists()


ANCHORED = """\
name: anchored
task: classification
batch: &batch 256
subdivisions: 8
steps: 100
model: {name: small_cnn, norm: batch, width: 32}
data: {name: digits, size: 32}
optim: {name: sgd, lr: 0.1, ref_batch: *batch, scaling: linear, momentum: 0.9, weight_decay: 0.0005}
schedule:
  warmup:
    - &phase {kind: linear, length: 20, start_factor: 0.1}
    - {<<: *phase, start_factor: 0.5}
  decay: {kind: cosine}
eval: {every: &every 40, batch: 360, metric: top1}
checkpoint: {every: *every}
"""
"""A recipe with an anchor on a scalar, its aliases, and a merge key (``<<``) of an anchored mapping."""


def test_ordinary_anchors_and_aliases_still_load(tmp_path, capsys):
    anchored = tmp_path / "anchored.yaml"
    anchored.write_text(ANCHORED)
    written_out = tmp_path / "written-out.yaml"  # the same recipe with every alias replaced by what it names
    written_out.write_text(ANCHORED.replace("&batch ", "").replace("*batch", "256").replace("&every ", "")
                           .replace("*every", "40").replace("&phase ", "")
                           .replace("{<<: *phase, start_factor: 0.5}", "{kind: linear, length: 20, start_factor: 0.5}"))
    assert "&" not in written_out.read_text() and "*" not in written_out.read_text()
    assert load_config(str(anchored)).model_dump() == load_config(str(written_out)).model_dump()
    assert main(["show", str(anchored)]) == 0
    assert "error" not in capsys.readouterr().err


def test_a_run_whose_config_is_an_alias_bomb_is_reported_with_a_note(tmp_path):
    run = make_run(tmp_path / "bombed", config=bomb(6) + "name: *l5\nbatch: 100\n")
    html = write_report([run], None).read_text(encoding="utf-8")
    cards = section(html, "runs")
    assert "config.yaml refused: more than" in cards and "YAML nodes" in cards
    assert "<summary>config.yaml" in cards and "l5: &amp;l5" in cards  # shown as it is, its values unused
    assert len(html) < 2_000_000  # nothing expanded on the page
    (data,) = read_runs([run])
    assert data.config == {} and data.name == "bombed"
    # the whole bomb too, and a config.yaml far larger than a config, each a note
    (run / "config.yaml").write_text(bomb(9) + "name: *l8\n")
    assert "config.yaml refused" in section(write_report([run], None).read_text(encoding="utf-8"), "runs")
    (run / "config.yaml").write_text("# padding\n" * 200_000)
    assert "larger than 1 MiB" in section(write_report([run], None).read_text(encoding="utf-8"), "runs")



# --- numbers the charts cannot draw ----------------------------------------------------------------------------

def records_run(folder: Path, records: list[dict], config: str = "subdivisions: 2\n") -> Path:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(config)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def card_of(html: str, label: str) -> str:
    cards = section(html, "runs")
    start = cards.index(f"{label}</h3>")
    return cards[start:cards.find('<div class="card"', start) if '<div class="card"' in cards[start:] else None]


def test_the_issues_two_numbers_are_text_with_a_note(tmp_path, capsys):
    """AdaScale records holding +-1e308 in one curve (the old report: ``arange: cannot compute length``) and a
    400-digit batch in a ``batch_grown`` event (``OverflowError`` in page.py): the page is written, each value named
    on its run's card, left out of the charts, the rest drawn."""
    adaptive = [{"step": s, "images": 16 * s, "lr": 0.1, "loss": 2.0 / s, "gain": 1.0 + s / 10, "scale": 2.0,
                 "batch": 32, "progress": 1.5 * s} for s in range(1, 7)]
    adaptive[1]["gain"], adaptive[3]["gain"] = 1e308, -1e308
    grown = [{"step": s, "images": 16 * s, "lr": 0.1, "loss": 2.0 / s} for s in range(1, 7)]
    grown.insert(3, {"step": 3, "event": "batch_grown", "batch": 10**400, "noise_scale": 500.0})
    runs = [records_run(tmp_path / "curve", adaptive), records_run(tmp_path / "event", grown)]
    out = tmp_path / "report.html"
    assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    assert ("2 value(s) the report cannot draw or count with (NaN, infinite, beyond ±1e200, or a count past 2^53), "
            "shown here as text and left out of the charts: gain 1e+308 (step 2); gain -1e+308 (step 4)"
            in card_of(html, "curve"))
    assert "batch 100000…000 (401 digits) (batch_grown event, step 3)" in card_of(html, "event")
    curve, event = read_runs(runs)
    assert curve.series("gain")[0] == [1.0, 3.0, 5.0, 6.0]  # the others drawn
    assert "AdaScale gain r vs steps" in svg_texts(section(html, "loss"))
    assert event.batch == 16 and event.images_at(3) == 48  # images / step, as for a run without a batch event


TRAINING_KEYS = ("images", "epoch", "lr", "loss", "loss_box", "images_per_s", "skipped", "t_data", "t_forward",
                 "t_backward", "t_sync", "t_update", "t_other", "t_step", "t_bn_sync", "grad_norm", "loss_scale",
                 "batch", "gain", "scale", "progress", "noise_scale", "world")
"""Every number a training record holds (``engine/hooks/training_log.py`` and the measure hooks)."""
MEMORY_COLUMNS = ("time", "elapsed_s", "step", "rss_mib", "system_used_mib", "cuda_allocated_mib")


def hostile_run(folder: Path, high: object, low: object, updates_csv: bool = True) -> tuple[Path, int]:
    """A run of 7 steps in which every number the report reads, in every file, is ``high`` at step 3 and ``low`` at
    step 5 (those rows of memory.csv and updates.csv, every event the report reads a number of; config.yaml's
    ``batch``, ``world``, ``steps`` where the values are whole numbers, as only those are counts): a chart of any of
    them spans both. The others are ordinary, so every chart has points. ``updates_csv``: False leaves it out, so
    the records' ``top_updates`` are read. -> (the folder, the values replaced)."""
    folder.mkdir(parents=True)
    replaced = 0

    def value(step: int, ordinary: object, whole: bool = False) -> object:
        nonlocal replaced
        hostile = {3: high, 5: low}.get(step)
        if hostile is None or (whole and type(hostile) is not int):  # a place that reads whole numbers only
            return ordinary
        replaced += 1
        return hostile

    (folder / "config.yaml").write_text(f"batch: {value(3, 100, True)}\nsubdivisions: 2\nworld: "
                                        f"{value(5, 1, True)}\nsteps: {value(3, 7, True)}\n")
    lines = []
    for s in range(1, 8):
        record = {"step": s, **{key: value(s, round(1.0 + s / 10, 2)) for key in TRAINING_KEYS}}
        if not updates_csv:
            record["top_updates"] = [{"name": "fc.weight", "relative": value(s, 0.001 * s), "max_abs": 0.1}]
        lines.append(json.dumps(record))
        lines.append(json.dumps({"step": s, "images": 100 * s, "split": "val", "top1": value(s, s / 10),
                                 "loss": value(s, 1 / s)}))
    events = [(1, "started", {"world": (1, True), "time": (1000.0, False)}),
              (3, "batch_grown", {"batch": (200, True)}), (3, "input_pipeline", {"share": (0.1, False)}),
              (5, "resumed", {"world": (1, True), "time": (2000.0, False), "stopped_at": (6, False)}),
              (5, "skipped", {"skipped": (1, False)}), (5, "out_of_memory", {"subdivisions": (4, False)})]
    for s, kind, fields in events:
        lines.append(json.dumps({"step": s, "event": kind, **{k: value(s, v, whole) for k, (v, whole) in
                                                              fields.items()}}))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with open(folder / "memory.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(MEMORY_COLUMNS)
        for i in range(7):
            writer.writerow([json.dumps(value(i, v)) for v in (1000 + 5 * i, 5 * i, i, 800 + i, 900 + i, 100 + i)])
    if updates_csv:
        with open(folder / "updates.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "name", "max_abs", "relative"])
            writer.writerows([s, "fc.weight", 0.01, json.dumps(value(s, 0.001 * s))] for s in range(1, 8))
    return folder, replaced


HOSTILE_PAIRS = {"floats": (1e308, -1e308), "ints": (10**400, -(10**400)), "infinite": (math.inf, math.nan),
                 "counts": (2**60, -1)}
"""Values no axis holds, and (``counts``) whole numbers an axis holds but the report cannot count with (a batch of
2^60, a world of -1): only those read as counts are noted."""


@pytest.mark.filterwarnings("error::UserWarning")  # matplotlib's: a layout that collapsed (phase bars past 100 %)
def test_every_number_the_charts_cannot_draw_is_text_and_left_out_with_a_note(tmp_path):
    """The kind: every number of every file a report reads, set to a value no axis holds, in one report with an
    ordinary run. The page is written; each run's card names the count of such values (the first of them as text);
    no chart holds one; the rest is drawn."""
    runs = {name: hostile_run(tmp_path / name, *pair, updates_csv=name != "ints")
            for name, pair in HOSTILE_PAIRS.items()}
    ordinary = make_run(tmp_path / "ordinary")
    out = tmp_path / "report.html"
    assert main(["report", *(str(folder) for folder, _ in runs.values()), str(ordinary), "--out", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    assert "cannot draw" not in card_of(html, "ordinary")
    for name, (folder, replaced) in runs.items():
        (data,) = read_runs([folder])
        # 2^60 and -1 are drawn; noted only where the report counts: config.yaml's batch, world and steps, the
        # batch_grown event's batch, the resumed event's world, the out_of_memory event's subdivisions
        counts = 6 if name == "counts" else replaced
        assert data.undrawn_total == counts, (name, data.undrawn_total, counts, data.undrawn)
        assert f"{counts} value(s) the report cannot draw" in card_of(html, name)
        for text in data.undrawn:
            assert text.split(" (")[0] in card_of(html, name)
        if name == "counts":
            continue
        for key in TRAINING_KEYS:
            steps, _, values = data.series(key)
            assert steps == [1.0, 2.0, 4.0, 6.0, 7.0], (name, key, steps)
        if name == "ints":  # each count of the config and the events past 2^53: none used
            assert data.batch is None and data.planned_steps is None and data.world == 1  # the started event's
        assert all(math.isnan(v) or abs(v) < 1e4 for column in data.memory.values() for v in column)
    for anchor in ("loss", "evaluation", "throughput", "phases", "noise", "scale", "memory", "updates"):
        assert "<svg" in section(html, anchor), anchor


NUMBERS = st.one_of(
    st.floats(),  # NaN, infinities, 1e308, subnormals
    st.floats(min_value=-1e200, max_value=1e200),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([1e200, -1e200, 1.0000000000000001e200, 5e-324, -5e-324, 0.0, 2**53 + 1, 10**200]),
)
CHARTED = {"loss": charts.loss, "lr": charts.learning_rate, "batch": charts.global_batch,
           "gain": charts.adascale_gain, "noise_scale": charts.noise_scale, "loss_scale": charts.loss_scale_and_skipped,
           "grad_norm": charts.grad_norm}


def drawable_number(value: object) -> bool:
    """The rule restated: an int or float that is, as a float, finite and of magnitude at most 1e200."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value)) and abs(float(value)) <= 1e200
    except OverflowError:  # an int past a float
        return False


@pytest.mark.filterwarnings("error::UserWarning")  # matplotlib's: a layout that collapsed, a log axis with no data
@settings(deadline=None, derandomize=bool(os.environ.get("CI")), database=None, max_examples=12,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(CHARTED)), values=st.lists(NUMBERS, min_size=1, max_size=10),
       images=st.lists(st.one_of(NUMBERS, st.integers(0, 10**6)), min_size=1, max_size=3))
@example(key="batch", values=[0.0], images=[10**400])  # found: a batch curve's images NaN, then round(NaN) in page.py
@example(key="loss_scale", values=[1.0, 1.0, 5.795284783598489e97], images=[100])  # found: 30-digit labels of its
# log-2 axis crowded out the plot (constrained layout collapsed)
def test_any_numbers_in_a_curve_are_drawn_or_noted(tmp_path_factory, key, values, images):
    """Hypothesis: whatever numbers a charted key's records hold (any float, any whole number JSON holds, the
    bound's edges), and whatever their ``images``, its chart and the page's tables are made; the points drawn are
    the drawable values, by step; every other number is counted in the note, and named there."""
    folder = tmp_path_factory.mktemp("curve") / "run"
    records = [{"step": s, "images": images[s % len(images)], "lr": 0.1, key: v} for s, v in enumerate(values, 1)]
    (data,) = read_runs([records_run(folder, records, config="batch: 100\nsubdivisions: 2\n")])
    kept = [(float(s), float(v)) for s, v in enumerate(values, 1) if drawable_number(v)]
    steps, _, drawn = data.series(key)
    assert list(zip(steps, drawn, strict=True)) == kept
    unusable = sum(not drawable_number(r[k]) for r in records for k in {"images", key})
    assert data.undrawn_total == unusable
    placed = [v for _, v in kept if v > 0] if key in ("noise_scale", "loss_scale") else kept  # log axes
    svg = CHARTED[key]([data])
    assert (svg is not None) == (len(placed) >= charts.MIN_POINTS)
    assert charts.off_log_axis([data], key)[1] == len(kept) - len(placed)
    if svg is not None and len(placed) < len(kept):
        assert "at or below 0, which its log axis cannot place" in page.off_log_axis([data], key)
    assert ("cannot draw" in page.card(data, 0)) == (unusable > 0)
    assert all(at is None or math.isfinite(at) for at in map(data.images_at, range(len(values) + 2)))
    page.summary([data]) + page.points_table([data], [key]) + page.noise_verdicts([data])
