"""E copies of one model trained as one: stacked parameters, torch.func.vmap, and a vectorized AdamW.

Shapes: E members (copies), then each parameter's own shape. Member e of a stacked tensor is index e of its
first dimension. Every member keeps its own hyperparameters (learning rate, weight decay, betas, warm-up) as
(E,) tensors, so that a grid over them is one pack; what one member computes never reaches another.
"""

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap


class Stacked(nn.Module):
    """The parameters of E models of one architecture, stacked: `forward(*inputs)` runs model e on inputs[.][e].

    The first model serves as the code (its forward); its own tensors are not used. Parameters are registered
    under the model's names with "." written as "__" (module attribute names cannot hold dots).
    """

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        params, buffers = stack_module_state(models)  # name -> (E, ...)
        self.names = list(params)
        self.params = nn.ParameterDict({n.replace(".", "__"): nn.Parameter(t) for n, t in params.items()})
        for name, tensor in buffers.items():
            self.register_buffer("buffer__" + name.replace(".", "__"), tensor, persistent=False)
        self.buffer_names = list(buffers)
        object.__setattr__(self, "code", models[0].to("meta"))  # not a submodule: holds no state of the pack

    @property
    def size(self) -> int:
        return next(iter(self.params.values())).shape[0]

    def stacked(self) -> dict[str, torch.Tensor]:
        """name -> (E, ...) parameter, under the model's own names."""
        return {n: self.params[n.replace(".", "__")] for n in self.names}

    def stacked_buffers(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, "buffer__" + n.replace(".", "__")) for n in self.buffer_names}

    def forward(self, *inputs: torch.Tensor, **kwargs) -> torch.Tensor:
        """Each input (E, ...) -> the first output of each member's model, (E, ...): member e computed from
        inputs[.][e] with parameters [e]. (headlab's models return (output, extras); extras are dropped.)"""

        def member(params, buffers, *member_inputs):
            return functional_call(self.code, (params, buffers), member_inputs, kwargs)[0]

        return vmap(member, randomness="different")(self.stacked(), self.stacked_buffers(), *inputs)

    def member_state(self, e: int) -> dict[str, torch.Tensor]:
        """Member e's parameters as the model's own state dict entries (persistent buffers have none here)."""
        return {n: t[e].detach().clone() for n, t in self.stacked().items()}

    @torch.no_grad()
    def load_member(self, e: int, state: dict[str, torch.Tensor]) -> None:
        for name, tensor in self.stacked().items():
            tensor[e].copy_(state[name])


def per_member(values, like: torch.Tensor) -> torch.Tensor:
    """(E,) values as a tensor that broadcasts against a stacked tensor like `like` (E, ...)."""
    column = torch.as_tensor(values, dtype=like.dtype, device=like.device)
    return column.view(-1, *([1] * (like.dim() - 1)))


class PackedAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update on stacked parameters, with an (E,) learning rate, weight decay and betas.

    Written as torch's single-tensor AdamW (decoupled weight decay, bias corrections, eps outside the square root)
    so that member e follows exactly the steps an AdamW of its own would take. Parameters with `decay=False` in
    their group (biases, norms, vectors: the solo run's no-decay group) get no weight decay. `scale` (E,) multiplies
    every member's learning rate (the schedule); `alive` (E,) bool freezes members that diverged.
    """

    def __init__(self, groups: list[dict], lr, weight_decay, betas, eps: float = 1e-8):
        defaults = {"eps": eps, "decay": True}
        super().__init__(groups, defaults)
        ref = groups[0]["params"][0]
        self.lr = torch.as_tensor(lr, dtype=torch.float64)
        self.weight_decay = torch.as_tensor(weight_decay, dtype=torch.float64)
        self.betas = torch.as_tensor(betas, dtype=torch.float64).view(-1, 2)
        self.scale = torch.ones(len(self.lr), dtype=torch.float64)
        self.alive = torch.ones(len(self.lr), dtype=torch.bool, device=ref.device)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        lr = self.lr * self.scale  # (E,) on the CPU: a handful of numbers, no device round trip
        beta1, beta2 = self.betas[:, 0], self.betas[:, 1]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                grad, alive = p.grad, self.alive.view(-1, *([1] * (p.dim() - 1)))
                if group["decay"]:
                    p.mul_(torch.where(alive, per_member(1 - lr * self.weight_decay, p), 1))
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(grad, per_member(1 - beta1, p))
                exp_avg_sq.mul_(per_member(beta2, p)).addcmul_(grad, grad * per_member(1 - beta2, p))
                bias_correction1 = 1 - beta1**t
                bias_correction2_sqrt = (1 - beta2**t).sqrt()
                denom = (exp_avg_sq.sqrt() / per_member(bias_correction2_sqrt, p)).add_(group["eps"])
                step_size = torch.where(alive, per_member(lr / bias_correction1, p), 0)
                p.addcdiv_(exp_avg * step_size, denom, value=-1)
        return loss


def clip_per_member(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for each member on its own: the global 2-norm of member e's gradients,
    scaled down to max_norm where above. Returns the (E,) norms."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = torch.stack([g.flatten(1).square().sum(1) for g in grads]).sum(0).sqrt()  # (E,)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(per_member(coef, g).to(g.dtype))
    return norms
