"""A pack continued from its members' own last.ckpt (a requeued SLURM job, a sweep rerun with sweep.resume=true):
each member gets back its weights, AdamW moments, dropout stream, learning curve and best checkpoint, and the pack
its loop state, so that it ends as the pack left alone would have. Members continue together only from the same
step (train.py groups them so).

Shapes: E members, P parameters a member.
"""

import os
from pathlib import Path

import torch

from headlab.training import optim
from headlab.training.checkpoints import model_state, save_checkpoint_atomic
from headlab.training.pack.member import Member
from headlab.training.pack.module import PackedModule

MEMBER_ONLY = ("state_dict", "optimizer_states", "lr_schedulers", "callbacks", "hyper_parameters", "hparams_name")


def load(member: Member) -> None:
    """The member's last.ckpt (if it has one) into the member: its step, its dropout stream, its callbacks' states
    (learning curve, checkpoint tracking) and its best checkpoint so far."""
    from headlab.training.build import check_fits

    path = member.run_dir / "checkpoints" / "last.ckpt"
    if not os.path.lexists(path):
        return  # killed before its first checkpoint: it starts again from its first step (anything else by that
        # name, a pipe, a link, a folder, is for check_fits to refuse)
    member.start_step = check_fits(str(path), member.module)
    member.checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    stream = member.checkpoint.get("random_state", {}).get("torch")
    if stream is not None:
        member.stream = stream
    states = member.checkpoint.get("callbacks", {})
    for callback in member.callbacks:
        if callback.state_key in states:
            callback.load_state_dict(states[callback.state_key])
    tracking = next((s for k, s in states.items() if k.startswith("ModelCheckpoint") and s.get("monitor")), None)
    if tracking and tracking.get("best_model_path"):
        best = member.run_dir / "checkpoints" / Path(tracking["best_model_path"]).name
        if best.is_file():
            state = model_state(best)
            member.best = {"score": float(tracking["best_model_score"]), "path": best, "state": state}


def pack_checkpoint(members: list[Member], module: PackedModule, path: Path) -> Path | None:
    """Write the checkpoint the pack would have written at its members' step, from their last.ckpt files (all at
    that step): the stacked weights and AdamW moments, the loops and random states. None when no member resumes."""
    if not any(m.checkpoint for m in members):
        return None
    first = members[0].checkpoint
    checkpoint = {k: v for k, v in first.items() if k not in MEMBER_ONLY}
    stack = module.stack
    weights = [{n.removeprefix("model."): t for n, t in m.checkpoint["state_dict"].items()} for m in members]
    checkpoint["state_dict"] = {"stack.flat": torch.stack([stack.flat_row(w) for w in weights])}  # (E, P)
    optimizer = module.optimizer().state_dict()
    moments = [_moments(m) for m in members]
    if all(moments):
        optimizer["state"] = {
            0: {
                "step": int(moments[0]["step"]),
                "exp_avg": torch.stack([stack.flat_row(m["exp_avg"]) for m in moments]),  # (E, P)
                "exp_avg_sq": torch.stack([stack.flat_row(m["exp_avg_sq"]) for m in moments]),
            }
        }
    checkpoint.update(optimizer_states=[optimizer], lr_schedulers=[], callbacks={})
    save_checkpoint_atomic(checkpoint, path)
    return path


def _moments(member: Member) -> dict | None:
    """The member's AdamW moments by parameter name, and its step; None before its first step."""
    state = member.checkpoint.get("optimizer_states", [{}])[0].get("state", {})
    if not state:
        return None
    decayed, plain = optim.named_groups(member.module.model)  # the order of a single run's AdamW state
    named = {n: state[i] for i, n in enumerate(decayed + plain)}
    return {
        "step": float(next(iter(named.values()))["step"]),
        "exp_avg": {n: s["exp_avg"] for n, s in named.items()},
        "exp_avg_sq": {n: s["exp_avg_sq"] for n, s in named.items()},
    }
