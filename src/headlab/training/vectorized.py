"""E copies of one model trained as one: stacked parameters, torch.func.vmap, and a vectorized AdamW.

Shapes: E members (copies), then each parameter's own shape. Member e of a stacked tensor is index e of its
first dimension. Every member keeps its own hyperparameters (learning rate, weight decay, betas, warm-up) as
(E,) tensors, so that a grid over them is one pack; what one member computes never reaches another.
"""

import contextlib
import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from headlab.training import optim


class Stacked(nn.Module):
    """The parameters of E models of one architecture in one flat (E, P) parameter: `forward(*inputs)` runs
    model e on inputs[.][e] with row e. One tensor for all parameters of all members makes the optimizer step and
    gradient clipping a handful of kernels, whatever the number of members and parameter tensors.

    `template`, a copy of the first model on the meta device, gives the forward that every member runs with its own
    tensors; the models themselves are left as they were. `decay_mask` (P,) marks the entries that weight decay
    applies to (headlab.training.optim.decays, as in a single run's AdamW).
    `streams`: each member's own CPU random state (torch.get_rng_state()), from which its dropout draws when the
    members run one after another (`each`): member e then draws the masks its single run would draw, whatever
    its pack. None: every member draws from the process's stream.
    `compile`: the members' forward through torch.compile (model.compile): one graph serves every member, each
    computed from its own tensors; where the members run as one batched computation, that computation is compiled.
    `compute`: how the members compute together (pack.compute): `each` one after another, `batched` as one batched
    computation, `auto` the device's way (one_after_another); headlab.training.pack.compute measures which.
    """

    def __init__(
        self,
        models: list[nn.Module],
        streams: list[torch.Tensor] | None = None,
        compile: bool = False,
        compute: str = "auto",
    ):
        super().__init__()
        self.streams = None if streams is None else [s.clone() for s in streams]
        self.compute = compute
        self.member_forward = torch.compile(member_forward) if compile else member_forward
        self.batched_forward = torch.compile(batched_forward) if compile else batched_forward
        params, buffers = stack_module_state(models)  # name -> (E, ...)
        E = len(models)
        self.names, self.shapes = list(params), [tuple(t.shape[1:]) for t in params.values()]
        self.sizes = [t[0].numel() for t in params.values()]
        self.flat = nn.Parameter(torch.cat([t.reshape(E, -1) for t in params.values()], dim=1))  # (E, P)
        sized = zip(self.sizes, self.shapes, strict=True)
        mask = torch.cat([torch.full((n,), optim.decays(shape)) for n, shape in sized])
        self.register_buffer("decay_mask", mask, persistent=False)
        for name, tensor in buffers.items():
            self.register_buffer("buffer__" + name.replace(".", "__"), tensor, persistent=False)
        self.buffer_names = list(buffers)
        template = copy.deepcopy(models[0]).to("meta")  # the forward only: functional_call supplies all tensors
        template._compiled_call_impl = None  # a model compiled in place (model.compile) would run its own tensors
        object.__setattr__(self, "template", template)  # not a submodule: no state of the pack

    @property
    def size(self) -> int:
        return self.flat.shape[0]

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> (E, ...) view of an (E, P) tensor laid out like the parameters (the parameters, their
        gradients, AdamW's moments). One split: its backward writes every gradient in one pass."""
        E = flat.shape[0]
        chunks = flat.split(self.sizes, dim=1)
        return {n: c.view(E, *shape) for n, c, shape in zip(self.names, chunks, self.shapes, strict=True)}

    def stacked(self) -> dict[str, torch.Tensor]:
        """name -> (E, ...) parameter, under the model's own names."""
        return self.views(self.flat)

    def stacked_buffers(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, "buffer__" + n.replace(".", "__")) for n in self.buffer_names}

    def forward(self, *inputs: torch.Tensor, **kwargs) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Each input (E, ...) -> the first output of each member's model, (E, ...): member e computed from
        inputs[.][e] with parameters [e]. (headlab's models return (output, extras); extras are dropped, but for
        the load-balance loss asked for with need_balance=True: then (output (E, ...), balance (E,)).) Keyword
        arguments that are tensors are per member too (a head mask (E, B, L, H)); the others go to every member.

        Members run as one_after_another says: one after another (`each`), or as one batched computation
        (torch.func.vmap), one kernel launch serving them all."""
        if self.one_after_another(inputs[0].device):
            per_member = {k: v.unbind(0) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            return stack_outputs(self.each(*(x.unbind(0) for x in inputs), **per_member))
        return self.batched(*inputs, **kwargs)

    def one_after_another(self, device: torch.device) -> bool:
        """Whether the members run one after another (`each`) rather than as one batched computation: as `compute`
        says, and with `auto` on a CPU (until pack.compute has measured the pack's own step); always in a pack of
        one (a single run: nothing to batch, and its own model's fused kernels, SDPA and Triton, which do not run
        under vmap)."""
        if self.size == 1:
            return True
        return device.type == "cpu" if self.compute == "auto" else self.compute == "each"

    def batched(self, *inputs: torch.Tensor, **kwargs) -> torch.Tensor:
        """forward as one batched computation over the members (torch.func.vmap), on any device."""
        tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        fixed = {k: v for k, v in kwargs.items() if k not in tensors}
        member = self._member(fixed, member_forward)  # compiled, if at all, as the batched computation
        return self.batched_forward(member, self.stacked(), self.stacked_buffers(), tensors, *inputs)

    def each(self, *inputs: Sequence[torch.Tensor], **kwargs) -> list[torch.Tensor]:
        """Member e's first output on inputs[.][e], one member after another on views of the stacked parameters,
        each with the single model's fastest kernels (fused attention, native additive kernels); the members'
        inputs may differ in shape (each its own batch's length). Keyword arguments given as sequences are per
        member, as the inputs."""
        views = MemberViews.apply(self.flat, self.sizes, self.shapes)  # member by member, each of its tensors
        k = len(self.names)
        buffers = {n: t.unbind(0) for n, t in self.stacked_buffers().items()}
        per_member = {n: v for n, v in kwargs.items() if isinstance(v, list | tuple)}
        member = self._member({n: v for n, v in kwargs.items() if n not in per_member}, self.member_forward)
        outputs = []
        for e in range(self.size):
            with self.own_stream(e):
                outputs.append(
                    member(
                        dict(zip(self.names, views[e * k : (e + 1) * k], strict=True)),
                        {n: t[e] for n, t in buffers.items()},
                        {n: v[e] for n, v in per_member.items()},
                        *(x[e] for x in inputs),
                    )
                )
        return outputs

    @contextlib.contextmanager
    def own_stream(self, e: int):
        """Member e's CPU random state in place of the process's while it computes (its dropout masks), then put
        back, advanced by what it drew. Swapping costs two copies of 5 KB: nothing beside a forward."""
        if self.streams is None:
            yield
            return
        outer = torch.get_rng_state()
        torch.set_rng_state(self.streams[e])
        try:
            yield
        finally:
            self.streams[e] = torch.get_rng_state()
            torch.set_rng_state(outer)

    def _member(self, kwargs: dict, forward):
        # the template runs in the pack's mode (its dropout), read at each forward: Lightning's loops restore a
        # module's mode by setting .training on each submodule, which a .train() override would never see
        self.template.train(self.training)

        def member(params, buffers, member_kwargs, *member_inputs):  # vmap batches positional arguments only
            given = {**kwargs, **member_kwargs}
            outputs = forward(self.template, params, buffers, member_inputs, given)
            return (outputs[0], outputs[2]) if given.get("need_balance") else outputs[0]

        return member

    def member_state(self, e: int, flat: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Member e's parameters (or row e of another tensor laid out like them) as the model's own state dict
        entries (persistent buffers have none here)."""
        return {n: t[e].detach().clone() for n, t in self.views(self.flat if flat is None else flat).items()}

    def flat_row(self, named: dict[str, torch.Tensor]) -> torch.Tensor:
        """The inverse of member_state: a member's tensors by name (its parameters, or laid out like them) as one
        row (P,) of the stacked layout."""
        return torch.cat([named[n].reshape(-1).to(self.flat.dtype) for n in self.names])

    @torch.no_grad()
    def load_member(self, e: int, state: dict[str, torch.Tensor]) -> None:
        for name, tensor in self.stacked().items():
            tensor[e].copy_(state[name])


def member_forward(template: nn.Module, params: dict, buffers: dict, inputs: tuple, kwargs: dict):
    """The model's outputs computed from one member's tensors (the template holds none of its own)."""
    return functional_call(template, (params, buffers), inputs, kwargs)


def batched_forward(member, params: dict, buffers: dict, tensors: dict, *inputs: torch.Tensor):
    """member (Stacked._member) over every member at once: each (E, ...) argument split along its first dimension."""
    return vmap(member, randomness="different")(params, buffers, tensors, *inputs)


def stack_outputs(outputs: list) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The members' outputs, one after another, stacked as one batched computation returns them: [(...)] -> (E, ...);
    [(a, b)] -> ((E, ...), (E, ...))."""
    if isinstance(outputs[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*outputs, strict=True))
    return torch.stack(outputs)


class MemberViews(torch.autograd.Function):
    """An (E, P) flat parameter -> every member's parameters as views, member by member (E x len(sizes) tensors).
    The backward writes each gradient straight into its place of one (E, P) gradient, where autograd's own unbind
    and split would stack each parameter's gradients, then concatenate them all: two more copies, measured as a
    quarter of a CPU pack's step at the SST-2 recipe's size."""

    @staticmethod
    def forward(ctx, flat: torch.Tensor, sizes: list[int], shapes: list[tuple]):
        ctx.sizes = sizes
        return tuple(chunk.view(shape) for row in flat for chunk, shape in zip(row.split(sizes), shapes, strict=True))

    @staticmethod
    def backward(ctx, *grads):
        sizes = ctx.sizes
        ref = next(g for g in grads if g is not None)
        flat = torch.empty(len(grads) // len(sizes), sum(sizes), dtype=ref.dtype, device=ref.device)
        chunks = [chunk for row in flat for chunk in row.split(sizes)]  # in the order of the forward's views
        for chunk, grad in zip(chunks, grads, strict=True):
            if grad is None:
                chunk.zero_()
            else:
                chunk.copy_(grad.reshape(-1))
        return flat, None, None


class PackedAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update on stacked parameters, with an (E,) learning rate, weight decay and betas.

    Member e follows exactly the steps an AdamW of its own would take: on the CPU, each member's rows go through
    torch's fused AdamW kernel, which single runs use there too (optim.adamw); elsewhere, every member at once,
    written as torch's AdamW (decoupled weight decay, bias corrections, eps outside the square root). A group's
    `decay` says which entries get weight decay: True, False (biases, norms, vectors: the single run's no-decay
    group), or a mask along the last dimension (Stacked.decay_mask). `scale` (E,) multiplies every member's
    learning rate (the schedule); `alive` (E,) bool freezes members that diverged. `fused` forces one way or the
    other (False: the stacked update on the CPU too).
    """

    def __init__(self, groups: list[dict], lr, weight_decay, betas, eps: float = 1e-8, fused: bool | None = None):
        defaults = {"eps": eps, "decay": True}
        self.fused = fused  # None: fused on the CPU (contiguous tensors), stacked elsewhere
        super().__init__(groups, defaults)
        ref = groups[0]["params"][0]
        self.lr = torch.as_tensor(lr, dtype=torch.float64)
        self.weight_decay = torch.as_tensor(weight_decay, dtype=torch.float64)
        self.betas = torch.as_tensor(betas, dtype=torch.float64).view(-1, 2)
        self.scale = torch.ones(len(self.lr), dtype=torch.float64)
        self.alive = torch.ones(len(self.lr), dtype=torch.bool, device=ref.device)
        self.scratch: dict[torch.Tensor, torch.Tensor] = {}  # parameter -> a tensor like it, for temporaries
        self.segments: dict[torch.Tensor, list] = {}  # parameter -> its rows' decayed and other segments

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                on_cpu = p.device.type == "cpu" and p.is_contiguous() and p.grad.is_contiguous()
                if on_cpu if self.fused is None else self.fused:
                    self._member_by_member(p, group, state)
                else:
                    self._stacked(p, group, state)
        return loss

    def _member_by_member(self, p: torch.Tensor, group: dict, state: dict) -> None:
        """On the CPU: each live member's rows by torch's fused AdamW kernel (what torch.optim.AdamW(fused=True)
        runs, optim.adamw's single runs included), one pass over parameter, gradient and moments where the
        stacked update makes nine; a mask's decayed and other entries as two lists of contiguous segments."""
        step = torch.tensor(float(state["step"]))
        segments = self._segments(p, group["decay"])
        for e in torch.nonzero(self.alive).flatten().tolist():  # a frozen member is left as it is
            rows = [x[e].view(-1) for x in (p, p.grad, state["exp_avg"], state["exp_avg_sq"])]
            for decayed, cuts in segments:
                p_e, grad_e, exp_avg_e, exp_avg_sq_e = ([row[a:b] for a, b in cuts] for row in rows)
                torch._fused_adamw_(  # torch.optim.adamw._fused_adamw's call; the pinned torch has it
                    p_e, grad_e, exp_avg_e, exp_avg_sq_e, [], [step] * len(cuts),
                    lr=float(self.lr[e] * self.scale[e]), beta1=float(self.betas[e, 0]),
                    beta2=float(self.betas[e, 1]), weight_decay=float(self.weight_decay[e]) if decayed else 0.0,
                    eps=group["eps"], amsgrad=False, maximize=False,
                )  # fmt: skip

    def _segments(self, p: torch.Tensor, decay) -> list[tuple[bool, list[tuple[int, int]]]]:
        """A member row's entries as [(decayed, [(start, end), ...])]: the runs of equal value of a decay mask (one
        run a parameter of the flat layout), or the whole row."""
        size = p[0].numel()
        if not isinstance(decay, torch.Tensor):
            return [(bool(decay), [(0, size)])]
        if p not in self.segments:
            mask = decay.reshape(-1).cpu()
            cuts = [0, *(torch.nonzero(mask[1:] != mask[:-1]).flatten() + 1).tolist(), size]
            runs = [(bool(mask[a]), (a, b)) for a, b in zip(cuts, cuts[1:], strict=False)]
            kinds = {d: [r for v, r in runs if v == d] for d in (True, False)}
            self.segments[p] = [(d, runs_of_d) for d, runs_of_d in kinds.items() if runs_of_d]
        return self.segments[p]

    def _stacked(self, p: torch.Tensor, group: dict, state: dict) -> None:
        """Every member at once with (E,) hyperparameters (on a GPU: no member's value is read back)."""
        # (E,) learning rates; a frozen member's is 0. `alive` stays on its device: reading it would wait for the GPU
        lr = (self.lr * self.scale).to(self.alive.device) * self.alive
        beta1, beta2 = self.betas[:, 0], self.betas[:, 1]
        t, grad, exp_avg, exp_avg_sq = state["step"], p.grad, state["exp_avg"], state["exp_avg_sq"]
        # one (E, P) scratch tensor for every temporary, kept between steps: a fresh one each step costs its page
        # faults on a CPU
        scratch = self.scratch.get(p)
        if scratch is None:
            scratch = self.scratch[p] = torch.empty_like(p)
        decay = group["decay"]
        if isinstance(decay, torch.Tensor):  # 1 - lr wd on the masked entries, 1 elsewhere
            torch.mul(p, decay.to(p.dtype), out=scratch)
            p.sub_(scratch.mul_(per_row(lr * self.weight_decay.to(lr.device), p)))
        elif decay:
            p.mul_(per_row(1 - lr * self.weight_decay.to(lr.device), p))
        exp_avg.lerp_(grad, per_row(1 - beta1, p))
        exp_avg_sq.mul_(per_row(beta2, p))
        if (beta2 == beta2[0]).all():
            exp_avg_sq.addcmul_(grad, grad, value=float(1 - beta2[0]))
        else:
            exp_avg_sq.addcmul_(grad, grad * per_row(1 - beta2, p))
        step_size = per_row(lr / (1 - beta1**t).to(lr.device), p)  # (E,)
        denom = torch.sqrt(exp_avg_sq, out=scratch).div_(per_row((1 - beta2**t).sqrt(), p)).add_(group["eps"])
        if isinstance(step_size, float):
            p.addcdiv_(exp_avg, denom, value=-step_size)
        else:  # exp_avg / (denom / step): a frozen member's step 0 makes it exp_avg / inf = 0
            p.addcdiv_(exp_avg, denom.div_(step_size), value=-1)


def clip_per_member(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for each member on its own: the global 2-norm of member e's gradients,
    scaled down to max_norm where above. Returns the (E,) norms."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = member_norms(grads)  # (E,)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(per_row(coef, g))
    return norms


def per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor | float:
    """(E,) values, one a member, broadcasting against a stacked tensor like `like` (E, ...), or a () value against
    any tensor; a plain number when the values are on the CPU and all equal (cheaper, and exactly the arithmetic of
    torch's own optimizer)."""
    if values.dim() and values.device.type == "cpu" and (values == values[0]).all():
        return float(values[0])
    return values.to(like.device, like.dtype).view(-1, *([1] * (like.dim() - 1)))


def member_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """The global 2-norm of each member's gradients (E,) from stacked tensors (E, ...): each tensor's norms, then
    the norm of those, as torch's clip_grad_norm_ computes it (and no squared copy)."""
    return torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads]).norm(dim=0)
