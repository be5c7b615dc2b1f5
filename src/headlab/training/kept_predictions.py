"""Test predictions gathered batch by batch, for each member of a run or a pack, to keep in results.json
(headlab.stats.predictions says the format)."""

import torch

from headlab.stats import predictions
from headlab.training import objective


class KeptPredictions:
    """start() at the test epoch's start, add() each test batch, fields() at its end: one field per member."""

    def __init__(self):
        self.parts: list[list[tuple[torch.Tensor, torch.Tensor]]] = []

    def start(self) -> None:
        self.parts = []

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """logits (E, B, [n,] C), labels (E, B[, n])."""
        per_member = objective.scored_predictions(logits.detach(), labels)
        self.parts = self.parts or [[] for _ in per_member]
        for kept, (classes, correct) in zip(self.parts, per_member, strict=True):
            kept.append((classes.cpu(), correct.cpu()))

    def fields(self) -> list[dict | None]:
        """Each member's results.json "predictions" field (None for a member without test batches)."""
        return [
            predictions.encode(torch.cat([c for c, _ in kept]).numpy(), torch.cat([k for _, k in kept]).numpy())
            if kept
            else None
            for kept in self.parts
        ]
