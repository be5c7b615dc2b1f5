"""headlab-heads: what every head of a finished run does, without W&B.

headlab-heads RUN_DIR [--text "..."] [--out DIR] loads the run's best checkpoint and writes, for the probe set
(or the given sentences): one attention-map PNG per layer, the head-similarity PNG, and the statistics table
(statistics.csv, and printed).
"""

import argparse
import csv
import sys
from pathlib import Path

from omegaconf import OmegaConf


def _best_checkpoint(run_dir: Path) -> Path:
    found = sorted((run_dir / "checkpoints").glob("best-*.ckpt")) or sorted(run_dir.glob("checkpoints/*.ckpt"))
    if not found:
        raise SystemExit(f"headlab-heads: no checkpoint in {run_dir / 'checkpoints'}")
    return found[-1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headlab-heads", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory written by headlab-train")
    parser.add_argument("--text", action="append", default=[], help="a sentence to probe (text datasets; repeatable)")
    parser.add_argument("--out", type=Path, help="where to write (default: RUN_DIR/heads)")
    parser.add_argument("--n-probe", type=int, default=16, help="validation examples in the probe set")
    args = parser.parse_args(argv)
    config_file = args.run_dir / ".hydra" / "config.yaml"
    if not config_file.exists():
        raise SystemExit(f"headlab-heads: {args.run_dir} is not a headlab run directory (no .hydra/config.yaml)")

    import torch
    from rich.console import Console
    from rich.table import Table

    from headlab.analysis import figures, statistics
    from headlab.training.run import build

    cfg = OmegaConf.load(config_file)
    datamodule, model = build(cfg)
    checkpoint = _best_checkpoint(args.run_dir)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    try:
        model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    except RuntimeError as error:
        first = next(line.strip() for line in str(error).splitlines()[1:] if line.strip())
        raise SystemExit(f"headlab-heads: {checkpoint} does not fit the run's model config ({first})") from None
    model.eval()
    try:
        probe = datamodule.probe_batch(args.n_probe, args.text)
    except ValueError as error:
        raise SystemExit(f"headlab-heads: {error}") from None
    with torch.no_grad():
        _, weights = model(probe["tokens"], probe["padding_mask"], need_weights=True)
    report = statistics.head_report(weights, model.attention_padding_mask(probe["padding_mask"]))

    out = args.out or args.run_dir / "heads"
    out.mkdir(parents=True, exist_ok=True)
    length = int((~probe["padding_mask"][0]).sum())
    tokens = model.attention_labels(datamodule.token_strings(probe["tokens"][0, :length]))
    for layer, w in enumerate(weights):
        fig = figures.attention_maps(w[0, :, : len(tokens), : len(tokens)], tokens, title=f"layer {layer}")
        fig.savefig(out / f"attention_layer{layer}.png", dpi=120)
    figures.similarity_map(report["similarity"], model.n_heads).savefig(out / "similarity.png", dpi=120)
    columns = ["layer", "head", *statistics.STATISTICS]
    with (out / "statistics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(report["rows"])

    table = Table(title=f"heads of {args.run_dir} ({len(probe['tokens'])} probe examples)")
    for c in columns:
        table.add_column(c, justify="right")
    for row in report["rows"]:
        table.add_row(*(str(row[c]) if c in ("layer", "head") else f"{row[c]:.3f}" for c in columns))
    Console(width=max(Console().width, 130)).print(table)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
