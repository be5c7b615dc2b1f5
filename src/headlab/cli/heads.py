"""headlab-heads: what every head of a finished run does, without W&B.

headlab-heads RUN_DIR [--text "..."] [--out DIR] [--checkpoint best|last|FILE] loads the run's best checkpoint
(or the one named) and writes, for the probe set (or the given sentences): the attention maps of each layer
(attention_layer_<l>.png), head similarity (similarity.png), the statistics table (statistics.csv, and printed)
and the interactive head view (view.html, opens in any browser without network).
"""

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from headlab.cli.arguments import at_least
from headlab.escape import csv_cell, terminal
from headlab.files import read_received
from headlab.printing import Column, print_table
from headlab.record import is_finite_number


def _measured(heads_json: Path, checkpoint: Path, n_layers: int, n_heads: int) -> dict | None:
    """The run's heads.json, when its importance was measured on this checkpoint's weights; one that is not a head
    analysis of this model (a received file: a row missing or out of range, a value that is no number) is said in
    one line and left out, and the rest is drawn."""
    try:
        report = json.loads(read_received(heads_json))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        print(terminal(f"headlab-heads: {heads_json} cannot be read ({error}): left out"), file=sys.stderr)
        return None
    ok = isinstance(report, dict) and isinstance(report.get("checkpoint"), str)
    if not (ok and Path(report["checkpoint"]).name == checkpoint.name and "pruning_curve" in report):
        return None
    if why := _not_an_analysis(report, n_layers, n_heads):
        print(terminal(f"headlab-heads: {heads_json}: {why}: its importance is left out"[:500]), file=sys.stderr)
        return None
    return report


def _not_an_analysis(report: dict, n_layers: int, n_heads: int) -> str | None:
    """Why a measured heads.json is no head analysis of a model of n_layers x n_heads, or None."""
    from headlab.heads import causal_report

    rows, seen = report.get("rows"), set()
    if not isinstance(rows, list):
        return "its rows are not a list"
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            return f"row {i} is not an object"
        where = (row.get("layer"), row.get("head"))
        if not all(_is_int(v) and 0 <= v < n for v, n in zip(where, (n_layers, n_heads), strict=True)):
            return f"row {i} names no head of this model (layer {where[0]!r}, head {where[1]!r})"
        numbers = ["importance", *(k for k in causal_report.measured([row]) if k != "role")]
        if bad := [k for k in numbers if not is_finite_number(row.get(k))]:
            return f"row {i}'s {bad[0]} is {row.get(bad[0])!r}, not a number"
        if not isinstance(row.get("role", ""), str):
            return f"row {i}'s role is {row['role']!r}, not a name"
        seen.add(where)
    if len(seen) < n_layers * n_heads:
        return f"{n_layers * n_heads - len(seen)} of the model's {n_layers * n_heads} heads have no row"
    curves = report.get("pruning_baselines", {})
    if not isinstance(curves, dict):
        return "its pruning_baselines is not an object"
    for name, curve in {"importance": report["pruning_curve"], **curves}.items():
        points = curve if isinstance(curve, list) else [None]
        numbers = [p.get(k) if isinstance(p, dict) else None for p in points for k in ("fraction_pruned", "metric")]
        if not all(map(is_finite_number, numbers)):
            return f"its {name} pruning curve is not a list of points (fraction_pruned, metric)"
    return None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headlab-heads", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory written by headlab-train")
    parser.add_argument("--text", action="append", default=[], help="a sentence to probe (text datasets; repeatable)")
    parser.add_argument("--out", type=Path, help="where to write (default: RUN_DIR/heads)")
    parser.add_argument(
        "--n-probe",
        type=at_least(0),
        help="validation examples in the probe set (default 16; with --text: 0, the sentences alone)",
    )
    parser.add_argument("--checkpoint", default="best", help="best (default), last, or a checkpoint file")
    args = parser.parse_args(argv)

    import numpy as np

    from headlab.cli import saved_run
    from headlab.files import write_bytes_atomic, write_text_atomic
    from headlab.heads import causal_report, figures, head_view, probe, statistics

    datamodule, model, checkpoint = saved_run.load(args.run_dir, args.checkpoint, "headlab-heads")
    try:
        n_probe = args.n_probe if args.n_probe is not None else 0 if args.text else 16  # a user's sentences first
        batch = datamodule.probe_batch(n_probe, args.text)
    except ValueError as error:
        raise SystemExit(f"headlab-heads: {error}") from None
    seen = probe.attention(model, datamodule, batch)
    report = seen["report"]
    snapshot = probe.snapshot(model, datamodule, batch, seen, step=0, examples=head_view.MAX_EXAMPLES)

    out = args.out or args.run_dir / "heads"
    out.mkdir(parents=True, exist_ok=True)
    pngs = figures.render_heads(snapshot)  # attention/layer_0, heads/similarity
    measured = _measured(args.run_dir / "heads.json", checkpoint, model.n_layers, model.n_heads)
    if measured:  # importance and pruning curves, as the run measured them on this checkpoint
        probe.with_measured(report["rows"], measured)
        importance = {(r["layer"], r["head"]): r.get("importance") for r in measured.get("rows", [])}
        scores = np.array([[importance[(layer, h)] for h in range(model.n_heads)] for layer in range(model.n_layers)])
        curves = {"importance": measured["pruning_curve"], **measured.get("pruning_baselines", {})}
        plain = {o: [{k: p[k] for k in ("fraction_pruned", "metric")} for p in c] for o, c in curves.items()}
        split, metric = measured.get("importance_split", "train"), f"{measured.get('pruning_split', 'val')} accuracy"
        pngs |= figures.render_importance(
            scores=scores, curves=plain, split=split, metric=metric, causal=report["rows"]
        )
    for name, data in pngs.items():  # attention_layer_0.png, similarity.png, importance_map.png, pruning_curves.png
        write_bytes_atomic(out / f"{name.replace('attention/', 'attention_').removeprefix('heads/')}.png", data)
    probe.write_head_view(out / "view.html", snapshot, f"{args.run_dir}: heads of {checkpoint.name}")
    columns = ["layer", "head", *statistics.measured(report["rows"])]
    columns += ["importance"] if "importance" in report["rows"][0] else []
    columns += causal_report.measured(report["rows"])
    written = io.StringIO(newline="")
    writer = csv.DictWriter(written, fieldnames=columns)
    writer.writeheader()
    writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in report["rows"])
    write_text_atomic(out / "statistics.csv", written.getvalue())

    title = f"heads of {args.run_dir} ({len(batch['tokens'])} probe examples)"
    cells = [[f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in columns] for row in report["rows"]]
    print_table(title, [Column(c, "cut") for c in columns], cells)
    names, share = seen["roles"]["names"], seen["roles"]["share"]  # (L, H, R)
    where = [[str(layer), str(head), *(f"{v:.0%}" for v in row)] for layer, heads in enumerate(share)
             for head, row in enumerate(heads)]  # fmt: skip
    where.append(["", "uniform", *(f"{v:.0%}" for v in seen["roles"]["uniform"])])
    print_table(
        "where each head looks: the share of attention per key, over all probe queries; last row: the shares of "
        "attention spread evenly (a head prefers a key where it gives more)",
        [Column(c, "cut") for c in ["layer", "head", *names]],
        where,
    )
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
