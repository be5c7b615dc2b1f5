"""A run's training budget, read from what it recorded: its training FLOPs (FLOPs a token times the real training
tokens its curve counted, times the passes a step makes over its batch), and a metric at an equal budget of steps
or FLOPs, read from its validation curve ("val/acc@step=N", "val/acc@flops=F")."""

import math

BUDGETS = {"steps": "step", "flops": "flops"}  # --at steps=N | flops=F: the metric's val/acc@step=N | @flops=F
# A FLOP budget is written rounded (--at flops=2.2814e12 for 2.2813824e12): a run counts as having spent it, and a
# curve point as within it, up to this relative difference (the FLOP count itself is an estimate far coarser)
FLOPS_ROUNDING = 1e-4


def passes_per_step(config: dict) -> int:
    """Forward-and-backward passes a training step makes over its batch: two for R-Drop (optim.rdrop > 0: two
    dropout passes), times two for SAM (optim.sam_rho > 0: an ascent and a descent step)."""
    return (2 if config.get("optim.rdrop") else 1) * (2 if config.get("optim.sam_rho") else 1)


def flops_at(record: dict, point: dict) -> float | None:
    """Training FLOPs spent by a curve point: the run's FLOPs a token (forward and backward, Kaplan et al. 2020:
    6 N plus attention over the sequence length) times the real training tokens counted by then, times the
    passes a step makes. None for a run whose curve counts no tokens (made before headlab counted them)."""
    per_token, tokens = record.get("flops_per_token"), point.get("tokens")
    if not per_token or tokens is None:
        return None
    return float(per_token) * tokens * passes_per_step(record.get("config") or {})


def training_flops(record: dict) -> float | None:
    """The run's training FLOPs: those spent by its last validation (the end of training)."""
    curve = record.get("curve") or []
    return flops_at(record, curve[-1]) if curve else None


def at_budget(record: dict, metric: str, budget: str, amount: float):
    """The curve's value of metric at its last validation within the budget ("step" or "flops", up to
    FLOPS_ROUNDING): None for a run that stopped before spending it (it cannot say where it would have been), or
    whose curve has no such value."""
    curve = [p for p in record.get("curve") or [] if p.get(metric) is not None]
    spent = [p["step"] if budget == "step" else flops_at(record, p) for p in curve]
    slack = amount * FLOPS_ROUNDING if budget == "flops" else 0
    if not curve or any(s is None for s in spent) or spent[-1] < amount - slack:
        return None
    within = [p for p, s in zip(curve, spent, strict=True) if s <= amount + slack]
    return within[-1][metric] if within else None


def parse(metric: str) -> tuple[str, str, float] | None:
    """ "val/acc@flops=1e+12" -> ("val/acc", "flops", 1e12); None for a metric without a budget."""
    name, at, budget = metric.partition("@")
    kind, _, amount = budget.partition("=")
    if not at or kind not in BUDGETS.values():
        return None
    return name, kind, float(amount)


def label(option: str) -> str:
    """--at's "steps=N" or "flops=F" as the metric it adds ("val/acc@step=400", "val/acc@flops=2e+12"); ValueError
    for anything else."""
    kind, _, amount = option.partition("=")
    if kind == "steps" and amount.isdigit():
        return f"val/acc@step={int(amount)}"
    if kind == "flops" and float(amount) > 0:
        return f"val/acc@flops={float(amount):.6g}"
    raise ValueError(option)


def mean_flops(runs: list[dict]) -> float | None:
    """The mean training FLOPs of runs (None where none counted its tokens)."""
    found = [f for f in map(training_flops, runs) if f is not None and math.isfinite(f)]
    return sum(found) / len(found) if found else None
