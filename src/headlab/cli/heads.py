"""headlab-heads: what every head of a finished run does, without W&B.

headlab-heads RUN_DIR [--text "..."] [--out DIR] [--checkpoint best|last|FILE] loads the run's best checkpoint
(or the one named) and writes, for the probe set (or the given sentences): the attention maps of each layer
(attention_layer_<l>.png), head similarity (similarity.png), the statistics table (statistics.csv, and printed)
and the interactive head view (view.html, opens in any browser without network).
"""

import argparse
import csv
import json
import sys
from pathlib import Path


def _add_importance(rows: list[dict], heads_json: Path, checkpoint: Path) -> None:
    """Each head's importance from the run's heads.json, when it was measured on this checkpoint's weights."""
    try:
        report = json.loads(heads_json.read_text())
    except (OSError, ValueError):
        return
    if report.get("checkpoint") and Path(report["checkpoint"]).name == checkpoint.name:
        measured = {(r["layer"], r["head"]): r.get("importance") for r in report.get("rows", [])}
        for row in rows:
            row["importance"] = measured.get((row["layer"], row["head"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headlab-heads", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory written by headlab-train")
    parser.add_argument("--text", action="append", default=[], help="a sentence to probe (text datasets; repeatable)")
    parser.add_argument("--out", type=Path, help="where to write (default: RUN_DIR/heads)")
    parser.add_argument("--n-probe", type=int, default=16, help="validation examples in the probe set")
    parser.add_argument("--checkpoint", default="best", help="best (default), last, or a checkpoint file")
    args = parser.parse_args(argv)

    import torch
    from rich.console import Console
    from rich.table import Table

    from headlab.analysis import figures, head_view, statistics
    from headlab.cli import saved_run
    from headlab.training.attention_logging import probe_snapshot, write_head_view

    datamodule, model, checkpoint = saved_run.load(args.run_dir, args.checkpoint, "headlab-heads")
    try:
        probe = datamodule.probe_batch(args.n_probe, args.text)
    except ValueError as error:
        raise SystemExit(f"headlab-heads: {error}") from None
    with torch.no_grad():
        _, weights = model(probe["tokens"], probe["padding_mask"], need_weights=True)
    report = statistics.head_report(weights, model.attention_padding_mask(probe["padding_mask"]))
    snapshot = probe_snapshot(model, datamodule, probe, weights, report, step=0, examples=head_view.MAX_EXAMPLES)

    out = args.out or args.run_dir / "heads"
    out.mkdir(parents=True, exist_ok=True)
    _add_importance(report["rows"], args.run_dir / "heads.json", checkpoint)
    for name, data in figures.render_heads(snapshot).items():  # attention/layer_0, heads/similarity
        (out / f"{name.replace('attention/', 'attention_').removeprefix('heads/')}.png").write_bytes(data)
    write_head_view(out / "view.html", snapshot, f"{args.run_dir}: heads of {checkpoint.name}")
    columns = ["layer", "head", *statistics.STATISTICS, *(["importance"] if "importance" in report["rows"][0] else [])]
    with (out / "statistics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(report["rows"])

    table = Table(title=f"heads of {args.run_dir} ({len(probe['tokens'])} probe examples)")
    for c in columns:
        table.add_column(c, justify="right")
    for row in report["rows"]:
        table.add_row(*(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns))
    Console(width=max(Console().width, 130)).print(table)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
