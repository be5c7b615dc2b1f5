"""Per-head attention logging while a run trains, and its head analysis once training ends (AttentionLogger), with
what both draw from: the probe snapshot, the head view page, and figures for W&B and TensorBoard.

Shapes: B probe examples, L layers, H heads, n positions.
"""

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch

from headlab.files import write_json_atomic
from headlab.heads import causal_report, figures, head_view, importance, probe, statistics

# The head analysis runs the model outside Lightning's autocast, with weights returned and heads masked: with
# model.compile=true each of those states would be one more compilation (enough of them hit torch's recompile
# limit on a GPU). It runs rarely: eagerly, also when the model is compiled.
run_eagerly = torch.compiler.set_stance("force_eager")  # a decorator (it restores the stance it set at once)


@dataclass
class HeadAnalysis:
    """What the end-of-training analysis measured on one model: importance (L, H), pruning curves by order, the
    splits they used, the time taken and the examples per split."""

    scores: torch.Tensor
    curves: dict[str, list[dict]]
    importance_split: str
    pruning_split: str
    seconds: float
    examples: dict[str, int] = field(default_factory=dict)

    def record(self) -> dict:
        """Its fields in heads.json (beside the rows and the curves)."""
        return {
            "importance_split": self.importance_split,
            "pruning_split": self.pruning_split,
            "analysis_seconds": round(self.seconds, 3),
            "analysis_examples": self.examples,
        }


class AttentionLogger(pl.Callback):
    """What every head does, logged while training and analysed once training ends.

    Every `every_n_val_epochs` validations, on a fixed probe batch (the same `n_probe` validation examples every
    time, drawn with the seed, plus `sentences` for text data): each statistic per (layer, head) as
    heads/L{l}/H{h}/{stat} to every logger; every `figures_every_n_val_epochs` validations, to W&B and TensorBoard,
    per-layer attention-map figures and the head similarity figure (W&B also gets the statistics as a table). Both
    after the last epoch. With `figures_every_n_val_epochs` 0 no figure is drawn and no table logged, here or at the
    end (a figure costs a small run more than its training: heads.json and the scalars hold the numbers).

    At the end of training, on the best checkpoint's weights (the final ones without a checkpoint): head importance
    on `analysis_batches` batches of `importance_split`, and pruning curves on as many batches of `pruning_split`
    (masking by importance, and in the `pruning_baselines` orders), written with the statistics to heads.json;
    importance as heads/L{l}/H{h}/importance to every logger, its figure and the pruning curves' to W&B and
    TensorBoard, and the interactive head view to heads/view.html (and W&B). Rank 0 does all of it.
    """

    def __init__(
        self,
        out_dir: str,
        every_n_val_epochs: int = 1,
        figures_every_n_val_epochs: int = 5,
        n_probe: int = 16,
        sentences: tuple[str, ...] = (),
        importance: bool = True,
        pruning_step: float = 0.1,
        analysis_batches: int = 20,
        importance_split: str = "train",
        pruning_split: str = "val",
        pruning_baselines: tuple[str, ...] = ("reverse", "random"),
        seed: int = 0,
        causal_batches: int = 4,
    ):
        self.out_dir, self.n_probe = Path(out_dir), n_probe
        self.every, self.figures_every = every_n_val_epochs, figures_every_n_val_epochs
        self.sentences, self.importance, self.pruning_step = list(sentences), importance, pruning_step
        self.n_analysis_batches, self.seed = analysis_batches, seed
        self.causal_batches = causal_batches
        self.importance_split, self.pruning_split = importance_split, pruning_split
        self.pruning_baselines = list(pruning_baselines)
        self.val_epochs = 0
        self.probe: dict | None = None
        self.logging_seconds = 0.0  # time spent logging during training, reported in heads.json

    # the work, on any model, datamodule and loggers (a packed run calls it for each member)
    def _attention(self, model, datamodule, device) -> tuple[dict, dict]:
        """The probe batch (the same examples every time) and what the model makes of it (probe.attention)."""
        if self.probe is None:
            self.probe = datamodule.probe_batch(self.n_probe, self.sentences)
        batch = {k: v.to(device) for k, v in self.probe.items()}
        return batch, probe.attention(model, datamodule, batch)

    @run_eagerly
    def log_heads(
        self, model, datamodule, loggers: list, step: int, device, figures_due: bool = True, media: bool = True
    ) -> dict | None:
        """Statistics of every head on the probe batch to every logger. Where figures are due and a W&B or
        TensorBoard logger shows them, the figures too: rendered here, or (media=False) returned as a snapshot for
        log_media, so that a pack can render its members' figures in parallel (figures.render_heads)."""
        started = time.perf_counter()
        batch, seen = self._attention(model, datamodule, device)
        report = seen["report"]
        names = statistics.measured(report["rows"])
        scalars = {f"heads/L{r['layer']}/H{r['head']}/{s}": r[s] for r in report["rows"] for s in names}
        for logger in loggers:
            logger.log_metrics(scalars, step=step)
        snapshot = None
        if figures_due and self.media_loggers(loggers):
            snapshot = probe.snapshot(model, datamodule, batch, seen, step, figures.EXAMPLES)
            if media:
                self.log_media(loggers, snapshot, figures.render_heads(snapshot))
                snapshot = None
        self.logging_seconds += time.perf_counter() - started
        return snapshot

    @staticmethod
    def log_media(loggers: list, snapshot: dict, pngs: dict[str, bytes]) -> None:
        """The rendered figures of a snapshot to W&B and TensorBoard; its statistics table to W&B."""
        columns = ["layer", "head", *statistics.measured(snapshot["rows"])]
        log_images(loggers, pngs, snapshot["step"], tables={"heads/table": (columns, snapshot["rows"])})

    @property
    def orders(self) -> list[str]:
        """The pruning orders measured: by importance, then the baselines."""
        return ["importance", *self.pruning_baselines]

    def analysis_batches(self, datamodule, device) -> tuple[list[dict], list[dict]]:
        """The batches importance is measured on, and those the pruning curves are scored on."""
        ranked_on, scored_on = (
            self._batches(datamodule, s, device) for s in (self.importance_split, self.pruning_split)
        )
        return ranked_on, scored_on

    def _batches(self, datamodule, split: str, device, count: int | None = None) -> list[dict]:
        loader = itertools.islice(datamodule.ordered_dataloader(split), count or self.n_analysis_batches)
        return [{k: v.to(device) for k, v in batch.items()} for batch in loader]

    def causal(self, model, datamodule, device, rows: list[dict], roles: dict, scores) -> dict:
        """Each head's ablations on causal_batches of the pruning split (means over as many of the importance
        split), patching where the task defines corruptions, and roles (causal_report.measure), into rows; the
        record's other causal fields returned."""
        measured_on, reference = (
            self._batches(datamodule, split, device, self.causal_batches)
            for split in (self.pruning_split, self.importance_split)
        )
        return causal_report.measure(model, datamodule, measured_on, reference, rows, roles, self.seed, scores)

    @run_eagerly
    def analyse(self, model, datamodule, device) -> HeadAnalysis:
        """Head importance (L, H) and the pruning curves of the model as given, for publish."""
        ranked_on, scored_on = self.analysis_batches(datamodule, device)
        was_training = model.training
        model.eval()
        started = time.perf_counter()
        scores = importance.head_importance(model, ranked_on)  # (L, H)
        masks = importance.curve_masks(scores, self.pruning_step, self.orders, self.seed)  # by key, (L, H) each
        keys, metrics = list(masks), {}
        for start in range(0, len(keys), importance.MASKS_PER_FORWARD):
            chunk = keys[start : start + importance.MASKS_PER_FORWARD]
            metrics.update(zip(chunk, importance.accuracies(model, scored_on, [masks[k] for k in chunk]), strict=True))
        curves = importance.pruning_curves(scores, metrics, self.pruning_step, self.orders, self.seed)
        model.train(was_training)
        examples = {self.importance_split: ranked_on, self.pruning_split: scored_on}
        return self.head_analysis(scores, curves, time.perf_counter() - started, examples)

    def head_analysis(self, scores: torch.Tensor, curves: dict, seconds: float, examples: dict) -> HeadAnalysis:
        """A HeadAnalysis of these measurements; examples: the batches of each split they were measured on."""
        counts = {split: sum(len(b["labels"]) for b in batches) for split, batches in examples.items()}
        return HeadAnalysis(scores, curves, self.importance_split, self.pruning_split, seconds, counts)

    @run_eagerly
    def publish(self, model, datamodule, loggers, device, step: int, checkpoint, analysis, media=True) -> dict | None:
        """heads.json and heads/view.html of the model as given, with what analyse() measured (None: statistics
        only); importance to every logger, and its figures to W&B and TensorBoard: rendered here, or (media=False)
        returned as a job for log_importance_media, so that a pack can render its members' figures in parallel."""
        batch, seen = self._attention(model, datamodule, device)
        report = seen["report"]
        result = {
            "checkpoint": str(checkpoint) if checkpoint else None,  # None: the weights at the end of training
            "rows": report["rows"],
            "similarity": report["similarity"].tolist(),
            "probe_size": len(batch["tokens"]),
            "attention_roles": {k: v if k == "names" else v.tolist() for k, v in seen["roles"].items()},
            "logging_seconds": round(self.logging_seconds, 3),  # attention logging during training
            **({"mixing": seen["mixing"]} if seen["mixing"] else {}),  # talking heads' matrices
        }
        job = None
        if analysis:
            scores, curves = analysis.scores, dict(analysis.curves)
            for row in report["rows"]:
                row["importance"] = float(scores[row["layer"], row["head"]])
            if self.causal_batches:  # ablations, patching and roles, beside importance
                result.update(self.causal(model, datamodule, device, report["rows"], seen["roles"], scores))
            job = self._log_importance(loggers, report["rows"], scores, curves, step)
            if job and media:
                self.log_importance_media(loggers, job, figures.render_importance(**job["figures"]))
                job = None
            result.update(analysis.record())
            result.update(pruning_curve=curves.pop("importance"), pruning_baselines=curves)
        write_json_atomic(self.out_dir / "heads.json", result)
        snapshot = probe.snapshot(model, datamodule, batch, seen, step, head_view.MAX_EXAMPLES)
        view = self.out_dir / "heads" / "view.html"
        # one step: the weights' own (a checkpoint's name gives its step), not the step training ended at
        title = f"{self.out_dir.name}: heads of " + (Path(checkpoint).name if checkpoint else f"step {step}")
        probe.write_head_view(view, snapshot, title)
        for logger in _wandb_loggers(loggers):
            import wandb

            logger.experiment.log({"heads/view": wandb.Html(str(view), inject=False), "trainer/global_step": step})
        return job

    def _log_importance(
        self, loggers, rows: list[dict], scores, curves: dict[str, list[dict]], step: int
    ) -> dict | None:
        """Importance per head to every logger (W&B's summary keeps it); the pruning tables and W&B's own line
        plot to W&B. Returns the figures' job (importance map, pruning curves) where a logger shows figures."""
        causal = causal_report.measured(rows)
        numbers = ["importance", *(k for k in causal if k != "role")]
        for logger in loggers:
            logger.log_metrics({f"heads/L{r['layer']}/H{r['head']}/{k}": r[k] for r in rows for k in numbers}, step)
        if not self.media_loggers(loggers):
            return None
        for logger in _wandb_loggers(loggers):
            import wandb

            table = wandb.Table(
                columns=["fraction_pruned", "acc"],
                data=[[p["fraction_pruned"], p["metric"]] for p in curves["importance"]],
            )
            plot = wandb.plot.line(table, "fraction_pruned", "acc", title="pruning curve (Michel et al.)")
            logger.experiment.log({"heads/pruning_curve": plot, "trainer/global_step": step})
        columns = ["layer", "head", "importance", *causal, *statistics.measured(rows)]
        pruning = [
            {
                "order": order,
                "fraction_pruned": p["fraction_pruned"],
                "heads_pruned": p["heads_pruned"],
                "acc": p["metric"],
            }
            for order, curve in curves.items()
            for p in curve
        ]
        tables = {
            "heads/importance": (columns, rows),
            "heads/pruning_table": (["order", "fraction_pruned", "heads_pruned", "acc"], pruning),
        }
        return {"figures": self.importance_figures(rows, scores, curves), "tables": tables, "step": step}

    def importance_figures(self, rows: list[dict], scores, curves: dict[str, list[dict]]) -> dict:
        """What figures.render_importance draws of a model's analysis (publish's rows, analyse's scores and
        curves): plain arrays and lists, for a worker process."""
        causal = causal_report.measured(rows)
        plain = {order: [{k: p[k] for k in ("fraction_pruned", "metric")} for p in c] for order, c in curves.items()}
        figure_args = {"scores": scores.cpu().numpy(), "curves": plain, "split": self.importance_split}
        figure_args["causal"] = (
            [{k: r[k] for k in ("layer", "head", "importance", *causal)} for r in rows] if causal else None
        )
        figure_args["metric"] = f"{self.pruning_split} accuracy"
        return figure_args

    @staticmethod
    def log_importance_media(loggers: list, job: dict, pngs: dict[str, bytes]) -> None:
        """The rendered importance figures of a job (publish) to W&B and TensorBoard, with its tables to W&B."""
        log_images(loggers, pngs, job["step"], job["tables"])

    def due(self, epoch: int, max_epochs: int | None) -> tuple[bool, bool]:
        """Count a validation: (statistics due, figures due), at every n-th of each and both after the last epoch
        (figures never with figures_every_n_val_epochs 0)."""
        self.val_epochs += 1
        last = epoch + 1 >= (max_epochs or 0)
        figures = self.figures_every > 0 and (last or self.val_epochs % self.figures_every == 0)
        return last or self.val_epochs % self.every == 0, figures

    def media_loggers(self, loggers: list) -> list:
        """The loggers this logger draws figures and tables for: W&B and TensorBoard, none with
        figures_every_n_val_epochs 0 (schedule.draws_figures prices the same)."""
        from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

        shown = [logger for logger in loggers if isinstance(logger, WandbLogger | TensorBoardLogger)]
        return shown if self.figures_every else []


def log_images(loggers: list, pngs: dict[str, bytes], step: int, tables: dict | None = None) -> None:
    """PNG figures to W&B (with tables: name -> (columns, rows as dicts)) and to TensorBoard as images."""
    import io

    from lightning.pytorch.loggers import TensorBoardLogger
    from PIL import Image

    images = {name: Image.open(io.BytesIO(data)).convert("RGB") for name, data in pngs.items()}
    for logger in _wandb_loggers(loggers):
        import wandb

        media = {name: wandb.Image(image) for name, image in images.items()}
        for name, (columns, rows) in (tables or {}).items():
            media[name] = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
        logger.experiment.log({**media, "trainer/global_step": step})
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            for name, image in images.items():
                logger.experiment.add_image(name, np.asarray(image), step, dataformats="HWC")


def _wandb_loggers(loggers: list) -> list:
    from lightning.pytorch.loggers import WandbLogger

    return [logger for logger in loggers if isinstance(logger, WandbLogger)]
