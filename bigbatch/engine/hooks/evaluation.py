"""Evaluation every ``eval.every`` (and at the end), and ``checkpoints/best.pt`` by ``eval.metric``."""

from __future__ import annotations

from bigbatch.engine.hooks.base import Hook, every_steps, is_due
from bigbatch.engine.run import Run
from bigbatch.registry import HOOKS


class Evaluation(Hook):
    def __init__(self, run: Run) -> None:
        self.every = every_steps(run.cfg.eval.every, run.plan)

    def after_step(self, run: Run) -> None:
        done = run.state.step
        if not is_due(done, self.every, run.plan.steps):
            return
        metrics, raw = run.evaluate()
        run.events.evaluation(done, "val", metrics)
        if raw is not None:
            run.events.evaluation(done, "val_raw", raw)
        run.metrics = metrics
        best = run.state.best
        if best.improves(metrics[best.metric]):
            best.value, best.step = metrics[best.metric], done
            if run.proc.is_main:
                run.state.save(run.checkpoint_dir / "best.pt")
        run.hooks.after_eval("val", metrics)


HOOKS.register("evaluation", Evaluation, order=20)
