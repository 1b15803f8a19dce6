"""The report's HTML page: the runs' headers and tables, the charts inline, one self-contained file.

Nothing on the page is fetched: the charts are inline SVG, the style is in the page, there is no script. Every
text that comes from a run's files is escaped.
"""

from __future__ import annotations

import datetime
import math
from html import escape
from typing import Any

from bigbatch import __version__
from bigbatch.floor import run_files
from bigbatch.report import charts
from bigbatch.report.runs import MAX_EVENTS, PHASES, RunData, Segment, as_text, drawable

GENERATOR = "bigbatch report"
"""The ``<meta name="generator">`` content (followed by the version): what marks a file as a report written here,
which a later report may replace."""

STYLE = """
:root { color-scheme: light; --ink: #1d2330; --muted: #5b6473; --line: #e3e6eb; --card: #f7f8fa; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--ink); background: #fff; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 40px 0 6px; padding-top: 12px; border-top: 1px solid var(--line); }
h3 { font-size: 16px; margin: 18px 0 6px; }
p.lead, p.how { color: var(--muted); margin: 4px 0 12px; max-width: 80ch; }
nav { margin: 14px 0 8px; font-size: 14px; display: flex; flex-wrap: wrap; gap: 4px 14px; }
nav a { color: #2a5db0; text-decoration: none; white-space: nowrap; }
nav a:hover { text-decoration: underline; }
table { border-collapse: collapse; font-size: 13.5px; margin: 8px 0 14px; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: right; vertical-align: top; }
th:first-child, td:first-child { text-align: left; }
th { background: var(--card); font-weight: 600; }
td.text, th.text { text-align: left; }
.scroll { overflow-x: auto; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(330px, 1fr)); gap: 14px; margin: 12px 0; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px;
        border-top: 4px solid var(--run); }
.card h3 { margin: 0 0 6px; }
.card dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0; font-size: 14px; }
.card dt { color: var(--muted); }
.card dd { margin: 0; overflow-wrap: anywhere; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px;
          background: var(--run); }
.note { color: #8a4b00; font-size: 13.5px; margin: 6px 0 0; }
.absent { color: var(--muted); font-style: italic; }
details { margin: 8px 0 0; font-size: 13.5px; }
summary { cursor: pointer; color: #2a5db0; }
pre { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 10px; overflow: auto;
      max-height: 420px; font-size: 12.5px; }
figure { margin: 10px 0 18px; }
figure svg { width: 100%; height: auto; display: block; }
figcaption { color: var(--muted); font-size: 13px; }
"""


def fmt(value: Any) -> str:
    """A number for a person: integers with thousands separators (one of more than 24 digits by its first and last
    digits and its length, ``as_text``), others to 4 significant digits."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) < 10**24 else as_text(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == int(value) and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:.4g}"
    return str(value)


def cell(value: Any) -> str:
    """A value from a run's files, as HTML: :func:`fmt`, escaped (a record's string may hold ``<script>``)."""
    return escape(fmt(value))


def _table(head: list[str], rows: list[list[str]], text_columns: tuple[int, ...] = (0,)) -> str:
    """A table of already escaped cells."""
    def cell(tag: str, i: int, value: str) -> str:
        return f'<{tag} class="text">{value}</{tag}>' if i in text_columns else f"<{tag}>{value}</{tag}>"

    header = "".join(cell("th", i, h) for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table></div>'


def _run_name(run: RunData, index: int) -> str:
    return f'<span class="swatch" style="--run:{charts.colour(index)}"></span>{escape(run.label)}'


def _figure(svg: str | None, caption: str = "") -> str:
    if svg is None:
        return ""
    text = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f"<figure>{svg}{text}</figure>"


def _absent(text: str) -> str:
    return f'<p class="absent">{text}</p>'


# --- the runs ------------------------------------------------------------------------------------------------------

def when(seconds: float | None) -> str:
    """A wall-clock time of a run's record (seconds since the epoch), in the machine's local time, to the minute."""
    seconds = drawable(seconds)  # a record's number: maybe 10^400, past a float
    if seconds is None or not 0 <= seconds < 1e11:
        return "–"
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M")


def world_sizes(run: RunData) -> str:
    """The world size in words: ``2``, or ``2, then 4 from step 40`` for a run resumed on another one."""
    changes = run.worlds
    if len(changes) <= 1:
        return fmt(run.world)
    return fmt(changes[0][1]) + "".join(f", then {fmt(world)} from step {fmt(step)}" for step, world in changes[1:])


def restart_line(restart: Segment) -> str:
    """One restart in words: where it resumed, where the run had got before, on how many processes, when."""
    what = f"resumed at step {fmt(restart.step)}" if restart.resumed else f"started again at step {fmt(restart.step)}"
    if restart.stopped_at is not None:
        what += f" (it had got to step {fmt(restart.stopped_at)})"
    if restart.world is not None:
        what += f" on {fmt(restart.world)} process{'es' if restart.world != 1 else ''}"
    if restart.time is not None:
        what += f", {when(restart.time)}"
    return what + ("" if restart.source == run_files.METRICS else f"; from {restart.source}")


def micro_batch(run: RunData) -> str:
    batch, subdivisions, world = run.batch, run.subdivisions, run.world
    if batch is None or not isinstance(subdivisions, int) or subdivisions < 1:
        return "–"
    per = batch / ((world or 1) * subdivisions)  # micro-batch = batch / (world x subdivisions) (README)
    return fmt(per if per != int(per) else int(per)) + ("" if world else " (one process)")


def batch_plan(run: RunData) -> str:
    """The batch, its subdivisions and the micro-batch, in words."""
    if run.batch is None:
        return "–"
    plan = f"batch {fmt(run.batch)}, {fmt(run.subdivisions)} subdivisions: micro-batch {micro_batch(run)}"
    if run.world:
        since = f" (from step {fmt(run.worlds[-1][0])})" if len(run.worlds) > 1 else ""
        where = "on 1 process" if run.world == 1 else f"on each of {run.world} processes"
        return plan + f" {where}{since}"
    return plan + " (batch / (world × subdivisions); the world size is not recorded)"


def noise_verdicts(runs: list[RunData]) -> str:
    """Each run's batch against its last noise scale, in the words of the run's own summary line."""
    items = []
    for i, run in enumerate(runs):
        steps, _, noise = charts.series(run, "noise_scale")  # a noise scale at or below 0 says nothing of the batch
        if not noise or run.batch is None:
            continue
        scheduled = run.series("batch")[2]  # a batch schedule: the batch in effect at the end
        last, batch = noise[-1], int(scheduled[-1]) if scheduled else run.batch
        verdict = ("below it: a larger batch would still cut the steps nearly in proportion" if batch < last else
                   "above it: a larger batch would cut the steps less than in proportion")
        items.append(f"<li>{_run_name(run, i)}: noise scale ~{fmt(round(last))} images at step {fmt(int(steps[-1]))}; "
                     f"its batch of {fmt(batch)} is {verdict}</li>")
    return f"<ul>{''.join(items)}</ul>" if items else ""


def best_eval(run: RunData) -> tuple[str, str, float, int] | None:
    """``(split, metric, value, step)`` of the best evaluation by the config's ``eval.metric`` (lower is better for
    a loss), on ``val`` when there is one: the first of the best, over every evaluation record read."""
    metric = (run.config.get("eval") or {}).get("metric") if isinstance(run.config.get("eval"), dict) else None
    splits = sorted(run.evals, key=lambda s: (s != "val", s))
    if not splits:
        return None
    if not isinstance(metric, str):
        names = charts.eval_metrics([run])
        metric = names[0] if names else None
    curve = run.evals[splits[0]].get(metric) if metric else None
    if curve is None or curve.low is None or curve.high is None:
        return None
    value, step = curve.low if "loss" in metric else curve.high
    return splits[0], metric, value, step


def data_wait(run: RunData) -> str:
    share = drawable((run.last_events.get("input_pipeline") or {}).get("share"))
    if share is not None:
        return f"{100 * share:.1f} %"
    return "–"


def summary(runs: list[RunData]) -> str:
    worlds = any(run.world for run in runs)
    rows = []
    for i, run in enumerate(runs):
        best = best_eval(run)
        rate = run.mean("images_per_s")  # the first record's rate includes start-up: left out
        _, _, noise = run.series("noise_scale")
        _, _, losses = run.series("loss")
        planned = run.planned_steps
        steps = fmt(run.steps_done) + (f" / {fmt(planned)}" if planned is not None else "")
        rows.append([
            _run_name(run, i), escape(str(run.task or "–")), fmt(run.batch), escape(fmt(run.subdivisions)),
            micro_batch(run), *([escape(" → ".join(fmt(w) for _, w in run.worlds) or fmt(run.world))]
                                if worlds else []), steps, fmt(run.images_seen),
            cell(run.last.get("epoch") if run.last else None), fmt(losses[-1] if losses else None),
            escape(f"{best[1]} {fmt(best[2])} ({best[0]}, step {best[3]})") if best else "–",
            fmt(round(rate, 1) if rate is not None else None), fmt(noise[-1] if noise else None), data_wait(run),
        ])
    head = ["run", "task", "batch", "subdivisions", "micro-batch", *(["world"] if worlds else []), "steps",
            "images seen", "epochs", "last loss", "best evaluation", "images/s (mean)", "noise scale (last)",
            "waiting for data"]
    return _table(head, rows, text_columns=(0, 1, head.index("best evaluation")))


def _config_value(run: RunData, *keys: str) -> Any:
    node: Any = run.config
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def card(run: RunData, index: int) -> str:
    items = [
        ("folder", escape(str(run.path))),
        ("name", escape(run.name)),
        ("task", escape(str(run.task or "–"))),
        ("model", escape(str(_config_value(run, "model", "name") or "–"))),
        ("batch plan", escape(batch_plan(run))),
        *([("world size", escape(world_sizes(run)))] if run.world else []),
        ("steps", fmt(run.steps_done) + (f" of {fmt(run.planned_steps)}" if run.planned_steps else "")),
        *([("restarts", "<br>".join(escape(restart_line(r)) for r in run.restarts))] if run.restarts else []),
        ("images seen", fmt(run.images_seen)),
        ("optimizer", escape(f"{_config_value(run, 'optim', 'name') or '–'}, "
                             f"lr {fmt(_config_value(run, 'optim', 'lr'))} "
                             f"at batch {fmt(_config_value(run, 'optim', 'ref_batch'))}")),
        ("precision", escape(str(_config_value(run, "precision", "dtype") or "–"))),
    ]
    body = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    absent = (f'<p class="note">absent: {escape(", ".join(run.absent))} (its charts are left out)</p>'
              if run.absent else "")
    notes = "".join(f'<p class="note">{escape(note)}</p>' for note in run.notes)
    config = (f"<details><summary>config.yaml (the resolved config)</summary><pre>{escape(run.config_text)}</pre>"
              "</details>" if run.config_text is not None else "")
    events = (f"<details><summary>events ({run.events_total})</summary>{events_table(run)}</details>"
              if run.events else "")
    return (f'<div class="card" style="--run:{charts.colour(index)}"><h3>{_run_name(run, index)}</h3>'
            f"<dl>{body}</dl>{absent}{notes}{config}{events}</div>")


def events_table(run: RunData) -> str:
    rows = []
    for event in run.events[:MAX_EVENTS]:
        details = ", ".join(f"{k} {when(v) if k == 'time' and isinstance(v, (int, float)) else fmt(v)}"
                            for k, v in event.items() if k not in ("step", "event"))
        rows.append([escape(str(event.get("event"))), cell(event.get("step")), escape(details)])
    more = f"<p>… and {run.events_total - len(run.events)} more in metrics.jsonl</p>" \
        if run.events_total > len(run.events) else ""
    return _table(["event", "step", "values"], rows, text_columns=(0, 2)) + more


def final_evaluations(runs: list[RunData]) -> str:
    metrics = charts.eval_metrics(runs)
    rows = []
    for i, run in enumerate(runs):
        for split, last in sorted(run.last_evals.items(), key=lambda item: (item[0] != "val", item[0])):
            rows.append([_run_name(run, i), escape(split), cell(last.get("step"))]
                        + [cell(last.get(m)) for m in metrics])
    if not rows:
        return ""
    return "<h3>The last evaluation</h3>" + _table(["run", "split", "step", *map(escape, metrics)], rows,
                                                   text_columns=(0, 1))


def points_table(runs: list[RunData], keys: list[str]) -> str:
    """The values of the training records' ``keys`` whose points are too few to draw (``charts.too_few``): a row
    per run and recorded step."""
    if not keys:
        return ""
    rows = []
    for i, run in enumerate(runs):
        by_step: dict[float, dict[str, float]] = {}
        images: dict[float, float] = {}
        for key in keys:
            for step, seen, value in zip(*run.series(key), strict=True):
                by_step.setdefault(step, {})[key] = value
                images[step] = seen
        for step in sorted(by_step):
            seen = images[step]
            rows.append([_run_name(run, i), fmt(int(step)), fmt(int(seen) if math.isfinite(seen) else None),
                         *(fmt(by_step[step].get(key)) for key in keys)])
    return (f'<p class="how">Too few points to draw (fewer than {charts.MIN_POINTS} in every run): the values.</p>'
            + _table(["run", "step", "images seen", *map(escape, keys)], rows))


def evaluation_points(runs: list[RunData], metrics: list[str]) -> str:
    """Every evaluation of ``metrics`` (those with too few evaluations to draw): a row per run, split and step."""
    rows = []
    for i, run in enumerate(runs):
        for split, curves in sorted(run.evals.items(), key=lambda item: (item[0] != "val", item[0])):
            by_step: dict[float, dict[str, float]] = {}
            for metric in metrics:
                if metric in curves:
                    steps, _, values = curves[metric].points()
                    for step, value in zip(steps, values, strict=True):
                        by_step.setdefault(step, {})[metric] = value
            for step in sorted(by_step):
                images = run.images_at(step)
                rows.append([_run_name(run, i), escape(split), fmt(int(step)),
                             fmt(round(images) if images is not None else None),
                             *(fmt(by_step[step].get(metric)) for metric in metrics)])
    if not rows:
        return ""
    return ("<h3>Every evaluation of the metrics too few to draw</h3>"
            + _table(["run", "split", "step", "images seen", *map(escape, metrics)], rows, text_columns=(0, 1)))


def memory_points(runs: list[RunData]) -> str:
    """The samples of ``memory.csv`` where every run has too few to draw: a row per sample."""
    columns = charts.memory_columns(runs)
    rows = []
    for i, run in enumerate(runs):
        for k, minute in enumerate(run.memory.get("minutes", [])):
            step = run.memory.get("step", [])
            rows.append([_run_name(run, i), fmt(round(minute, 2) if math.isfinite(minute) else None),
                         fmt(int(step[k]) if k < len(step) and math.isfinite(step[k]) else None),
                         *(fmt(run.memory[c][k] if c in run.memory else None) for c in columns)])
    return (f'<p class="how">Too few samples to draw (fewer than {charts.MIN_POINTS} in every run): the samples.</p>'
            + _table(["run", "minutes", "step", *(escape(c) for c in columns)], rows))


def phase_table(runs: list[RunData]) -> str:
    """MegDet's breakdown of an iteration: each phase's mean seconds per step and share, a column pair a run."""
    measured = [(i, run, found) for i, run in enumerate(runs) if (found := run.phase_means()) is not None]
    if not measured:
        return ""
    head = ["phase"]
    for i, run, (_, count) in measured:
        head += [f"{_run_name(run, i)}<br>s / step", f"share<br>({count} steps)"]
    rows = []
    for phase in (*PHASES, "step"):
        row = [phase if phase != "step" else "<b>step</b>"]
        for _, _, (means, _) in measured:
            share = 100 * means[phase] / means["step"] if means["step"] > 0 else 0.0
            row += [f"{means[phase]:.4f}", f"{share:.1f} %"]
        rows.append(row)
    if any("bn_sync" in means for _, _, (means, _) in measured):  # a sub-phase, not added to the step
        row = ["<i>of which BN all-reduce</i>"]
        for _, _, (means, _) in measured:
            seconds = means.get("bn_sync")
            row += ["" if seconds is None else f"{seconds:.4f}",
                    "" if seconds is None or means["step"] <= 0 else f"{100 * seconds / means['step']:.1f} %"]
        rows.append(row)
    return _table(head, rows)


def off_log_axis(runs: list[RunData], key: str) -> str:
    """A note of the values of ``key`` a chart on a log axis left out (at or below 0), as text; "" if none."""
    shown, total = charts.off_log_axis(runs, key)
    if not total or not charts.drawn(runs, key):  # not drawn: the table of its values shows them all
        return ""
    more = f"; and {total - len(shown)} more" if total > len(shown) else ""
    return (f'<p class="note">{total} value(s) of {escape(key)} at or below 0, which its log axis cannot place, '
            f"shown here as text and left out of the chart: {escape('; '.join(shown))}{more}</p>")


# --- the page ------------------------------------------------------------------------------------------------------

SECTIONS = (
    ("runs", "Runs"), ("loss", "Loss and learning rate"), ("evaluation", "Evaluation"),
    ("throughput", "Throughput"), ("phases", "Where the step time goes"), ("updates", "Per-layer update sizes"),
    ("noise", "Gradient noise scale"), ("advisor", "Which batch, how many devices"),
    ("scale", "Loss scale, skipped steps, gradient norm"), ("memory", "Memory"),
)


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>{body}</section>'


def render(runs: list[RunData]) -> str:
    """The whole page for ``runs``."""
    labels = ", ".join(escape(run.label) for run in runs)
    body: dict[str, str] = {}

    body["runs"] = (summary(runs) + '<p class="how">micro-batch = batch / (world × subdivisions); where the run does '
                    "not record its world size (made before each start recorded it) the figure is for one process. "
                    "Images/s: the mean over the logged steps but the first (start-up). A run resumed after an "
                    "interruption lists its restarts on its card; the charts mark them (a dash-dot line of its "
                    "colour where it resumed, the steps it ran twice shaded).</p>"
                    + '<div class="cards">' + "".join(card(run, i) for i, run in enumerate(runs)) + "</div>")

    loss, lr, batch = charts.loss(runs), charts.learning_rate(runs), charts.global_batch(runs)
    adaptive = [chart for chart in (charts.adascale_gain(runs), charts.adascale_progress(runs)) if chart]
    few = points_table(runs, [key for key in ("loss", "lr", "batch", "gain", "progress") if charts.too_few(runs, key)])
    body["loss"] = ('<p class="how">Against steps the runs are compared update for update; against images seen, data '
                    "for data: a larger batch that reaches the same loss after the same images is using its "
                    "extra images as well as the smaller one. A run with a batch schedule "
                    "(<code>schedule.batch</code>) or an adaptive batch shows its global batch after the LR; an "
                    "adaptive run (AdaScale) then its gain r and its progress through the base schedule.</p>"
                    + (_figure(loss) + _figure(lr) + (_figure(batch) if batch else "")
                       + "".join(_figure(chart) for chart in adaptive) + few if loss or lr or few
                       else _absent("No training record in these runs.")))

    evaluation = charts.evaluation(runs)
    drawn = charts.eval_drawn(runs)
    undrawn = [metric for metric in charts.eval_metrics(runs) if metric not in drawn]
    more = len(drawn) - charts.MAX_METRICS
    once = all(len(curve.steps) <= 1 for run in runs for curves in run.evals.values() for curve in curves.values())
    if not undrawn:
        points = ""
    elif once:  # the table of the last evaluation holds every value
        which = "its values are" if evaluation is None else f"the values of {escape(', '.join(undrawn))} are"
        points = _absent(f"{'Each run was' if len(runs) > 1 else 'The run was'} evaluated once: {which} in the "
                         "table below, not drawn.")
    else:
        points = evaluation_points(runs, undrawn)
    body["evaluation"] = (
        '<p class="how">Each split (<code>val</code>, <code>val_raw</code>, ...) is its own line style, the run its '
        f"colour; images seen = step × batch (interpolated from the training records under a batch schedule). A "
        f"metric evaluated fewer than {charts.MIN_POINTS} times in every run is a table, not a chart.</p>"
        + (_figure(evaluation, f"{more} more metrics in the table below" if more > 0 else "") if evaluation
           else "" if undrawn else _absent("No evaluation record in these runs."))
        + points + final_evaluations(runs))

    rate = charts.throughput(runs)
    few = points_table(runs, ["images_per_s"] if charts.too_few(runs, "images_per_s") else [])
    body["throughput"] = ('<p class="how">Training images per second between logged steps (evaluations and '
                          "checkpoints included where they fall between two records).</p>"
                          + (_figure(rate) if rate else few or _absent("No throughput recorded.")))

    phases = charts.phases(runs)
    missing = [escape(run.label) for run in runs if run.phase_means() is None]
    unmeasured = (f"<p class=\"absent\">No phase times in {', '.join(missing)} (made before log.timing, or with "
                  "log.timing: off).</p>" if missing else "")
    body["phases"] = (
        '<p class="how">Each step split into disjoint phases that add up to it (MegDet\'s breakdown of an '
        "iteration): <b>data</b> waiting for the micro-batches, <b>forward</b> and <b>backward</b> of the "
        "micro-batches, <b>sync</b> the wait for the gradient all-reduce under DDP, <b>update</b> the optimizer "
        "step (with unscaling, clipping, EMA), <b>other</b> the rest. Mean over the logged steps but the first. A "
        "large data share says the input pipeline is the bottleneck; a large sync share, the network.</p>"
        + (_figure(phases) + phase_table(runs) + unmeasured if phases else _absent(
            "No run recorded phase times (t_forward, t_backward, ...): runs made before log.timing, or with "
            "log.timing: off.")))

    maps = []
    for run in runs:
        svg = charts.updates(run)
        if svg is not None and run.updates is not None:
            maps.append(_figure(svg, f"{len(run.updates.layers)} parameter tensors × {len(run.updates.steps)} logged "
                                     f"steps, from {escape(run.updates.source)}; grey: not measured, or weights "
                                     "that were all zero" + ("; a white dash-dot line where the run resumed, the "
                                                             "steps it ran twice shaded" if run.restarts else "")))
    body["updates"] = (
        '<p class="how">The relative update ‖ΔW‖ / ‖W‖ of each parameter tensor at each logged step, log scale: '
        "a row much brighter than the rest is a layer the learning rate moves faster than the others (LARS and "
        "LAMB even these out); a row that fades to dark has stopped learning. Values near 1e-3 per step are "
        "the usual rule of thumb; 1e-1 and above means the weights are being rewritten every step.</p>"
        + ("".join(maps) if maps else _absent("No update sizes recorded (log.updates: off, or a run made before "
                                              "it).")))

    noise = charts.noise_scale(runs)
    few = points_table(runs, ["noise_scale"] if charts.too_few(runs, "noise_scale") else [])
    body["noise"] = (
        '<p class="how">The simple noise scale B_simple = tr(Σ) / |G|² (McCandlish et al. 2018), estimated from '
        "the micro-batch and batch gradients, against the batch (the dashed line of the run's colour). It is the "
        "critical batch: growing a batch well below it cuts the steps to a result nearly in proportion; above it, "
        "less and less, so the extra images buy less. It grows as training proceeds: read it late in a run.</p>"
        + (_figure(noise) + off_log_axis(runs, "noise_scale") + noise_verdicts(runs) if noise
           else few + noise_verdicts(runs) if few else _absent(
            "No noise scale recorded (log.noise_scale: off, one micro-batch per process, or a run made before it).")))

    advised = [(run, charts.advice(run)) for run in runs if run.advice is not None]
    body["advisor"] = (
        '<p class="how">What <code>bigbatch plan CONFIG --devices ... --out RUN</code> predicted (the run '
        "directory's advisor.json): images/s and the wall time to the target (per S_min step where no target was "
        "given) against the global batch, a line per device count; the error bars are one standard deviation of "
        "the prediction (the measured spreads, and the range of an assumed overlap); the star is the recommended "
        "row, the shortest predicted wall time (docs/recipe.md, section Which batch, how many devices).</p>"
        + ("".join(_figure(svg, f"{escape(run.label)}: {len(run.advice.rows)} rows")
                   for run, svg in advised if svg is not None and run.advice is not None)
           or _absent("No advisor.json in these runs (bigbatch plan CONFIG --devices N,N,... --out RUN writes "
                      "one).")))

    scale, grad = charts.loss_scale_and_skipped(runs), charts.grad_norm(runs)
    few = points_table(runs, [key for key in ("loss_scale", "grad_norm") if charts.too_few(runs, key)])
    body["scale"] = (
        '<p class="how">A dynamic loss scale halves at each step whose gradients are not finite (the step is '
        "skipped) and grows again after a run of good steps. Many skipped steps waste compute; a scale that keeps "
        "falling points at a layer that overflows.</p>"
        + (_figure(scale) + off_log_axis(runs, "loss_scale") if scale else "" if few
           else _absent("No loss scale recorded and no step skipped."))
        + (_figure(grad, "The gradient norm, recorded when clipping by norm.") if grad else "") + few)

    memory = charts.memory(runs)
    body["memory"] = (
        '<p class="how">From each run\'s memory.csv, sampled every memory.interval seconds: resident memory of '
        "the process, the system's, on CUDA the allocated, reserved and peak device memory, and on a "
        "unified-memory device (Jetson) the RAM the GPU holds (unified gpu). Columns that stay at zero are left "
        "out.</p>"
        + (_figure(memory, "Where a run was stopped and resumed, the time between its last sample and its next "
                           "is shaded, a dash-dot line where it resumed." if any(r.memory_breaks for r in runs)
                   else "") if memory
           else memory_points(runs) if charts.memory_columns(runs) else _absent("No run has a memory.csv.")))

    nav = "".join(f'<a href="#{anchor}">{escape(title)}</a>' for anchor, title in SECTIONS)
    sections = "".join(_section(anchor, title, body[anchor]) for anchor, title in SECTIONS)
    written = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="{GENERATOR} {escape(__version__)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>bigbatch report: {labels}</title>
<style>{STYLE}</style>
</head>
<body>
<main>
<h1>bigbatch report</h1>
<p class="lead">{len(runs)} run{"s" if len(runs) != 1 else ""}: {labels}. Written {written} by bigbatch \
{escape(__version__)}; this file is self-contained (works offline).</p>
<nav>{nav}</nav>
{sections}
</main>
</body>
</html>
"""
