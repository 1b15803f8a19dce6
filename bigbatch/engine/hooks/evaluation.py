"""Evaluation every ``eval.every`` (and at the end), and ``checkpoints/best.pt`` by ``eval.metric``."""

from __future__ import annotations

from bigbatch.engine.hooks.base import Hook, every_steps, is_due
from bigbatch.engine.run import Run
from bigbatch.floor import run_files
from bigbatch.registry import HOOKS


class Evaluation(Hook):
    """Evaluation every ``eval.every`` and at the end; ``best.pt`` when ``eval.metric`` improves."""

    stage = "evaluate"

    def __init__(self, run: Run) -> None:
        self.every = every_steps(run.cfg.eval.every, run.plan, "eval.every")

    def after_step(self, run: Run) -> None:
        done = run.progress.step
        if not is_due(done, self.every, run.plan.steps, run.plan):
            return
        metrics, raw = run.evaluate()
        run.events.evaluation(done, "val", metrics)
        if raw is not None:
            run.events.evaluation(done, "val_raw", raw)
        best = run.state.best
        improved = best.improves(metrics[best.metric])
        if improved:
            best.value, best.step = metrics[best.metric], done
        run.hooks.after_eval("val", metrics)
        if improved:  # after after_eval: best.pt holds what the hooks learned from it
            run.state.save(run.checkpoint_dir / run_files.BEST)  # every rank (the metrics agree): rank 0 writes


HOOKS.register("evaluation", Evaluation)
