"""Every head design (conf/design/*.yaml) as a run composes it, in a small three-layer cls encoder whose every
parameter is moved from its start (each learned mixing and gate away from its identity), and a padded batch."""

import torch

from conftest import ROOT

DESIGN_FILES = sorted((ROOT / "conf" / "design").glob("*.yaml"))
IDS = [p.stem for p in DESIGN_FILES]


def perturbed_model(design: str, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, dict]:
    """(model in eval mode, {"tokens" (3, 9), "padding_mask" (3, 9), "labels" (3,)}) for design (a file's stem)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from headlab.model import Encoder

    with initialize_config_module("headlab.conf", version_base="1.3"):
        composed = compose("train", overrides=[f"+design={design}"]).model  # as a run gets it
    attention, positional = OmegaConf.to_container(composed.attention), composed.positional
    torch.manual_seed(0)
    model = Encoder(12, 3, 9, "cls", d_model=32, n_layers=3, attention=attention, positional=positional)
    model = model.to(dtype).eval()
    with torch.no_grad():  # every learned mixing and gate moved from its start
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    tokens = torch.randint(1, 12, (3, 9))
    padding = torch.arange(9)[None, :] >= torch.tensor([9, 4, 6])[:, None]
    return model, {"tokens": tokens.masked_fill(padding, 0), "padding_mask": padding, "labels": torch.tensor([0, 2, 1])}
