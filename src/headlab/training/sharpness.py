"""Sharpness-aware minimisation (SAM, Foret et al. 2021): each step's gradient is taken at the worst point within
a radius rho of the weights, so the optimiser prefers flat minima. Twice the compute of a plain step.

    g = grad L(w);  e = rho g / ||g||;  w <- optimiser step from w with grad L(w + e)
"""

import torch

from headlab.training.vectorized import per_row


class SharpnessAware:
    """A LightningModule mixin: with sam_rho() > 0, optimizer_step runs the training closure (training_step and
    backward) at w, ascends to w + e, runs it again there, and steps back before the optimiser's update. Gradient
    clipping applies to the second gradient. training_step reads self.ascended: True in the second pass, whose
    loss is not the run's (log nothing there)."""

    ascended = False

    def sam_rho(self) -> float:
        raise NotImplementedError

    def gradient_norms(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The norm e is scaled by: one over all of grads, () for a single run; (E,) for a pack's members."""
        raise NotImplementedError

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        rho = self.sam_rho()
        if not rho:
            return optimizer.step(closure=optimizer_closure)
        return optimizer.step(closure=lambda: self._two_passes(optimizer_closure, rho))

    def _two_passes(self, closure, rho: float):
        loss = closure()
        params = [p for p in self.parameters() if p.grad is not None]
        grads = [p.grad for p in params]
        norms = self.gradient_norms(grads)  # () or (E,)
        # no ascent where the gradient is not finite (a float16 overflow the scaler skips, a diverged member)
        scale = torch.where(torch.isfinite(norms) & (norms > 0), rho / norms, 0.0)
        with torch.no_grad():
            ascent = [g * per_row(scale, g) for g in grads]
            for p, e in zip(params, ascent, strict=True):
                p.add_(e)
        self.ascended = True
        try:
            closure()
        finally:
            self.ascended = False
            with torch.no_grad():
                for p, e in zip(params, ascent, strict=True):
                    p.sub_(e)
        return loss
