"""Head roles across the seeds of an arm: per group of runs, how many runs have a head in each role (heads.json
rows' `role`, headlab.heads.causal.head_role), with exact Clopper-Pearson intervals. A head's index means
nothing from one seed to another: heads are matched across seeds by their role. With a solve threshold, the runs
that solved and those that did not are counted apart (what a head does when the arm succeeds, and when it fails)."""

from headlab.heads.causal import ROLES_BEYOND_FETCHING
from headlab.stats import inference
from headlab.stats.comparison import group_runs


def role_counts(records: list[dict], keys: list[str], solved: tuple[str, float] | None = None) -> list[dict]:
    """[{"group": {key: value}, "outcome": "all" | "solved" | "not solved", "runs", "roles": {role: solve_rate
    dict (k runs of n with a head in that role, exact interval), "heads": mean heads in it a run}}] for the
    groups whose runs recorded roles."""
    out = []
    for values, runs in group_runs(records, keys).items():
        runs = [r for r in runs if any("role" in row for row in (r.get("head_analysis") or {}).get("rows", []))]
        if not runs:
            continue
        found = {row["role"] for r in runs for row in r["head_analysis"]["rows"] if "role" in row}
        names = sorted(found - set(ROLES_BEYOND_FETCHING)) + [n for n in ROLES_BEYOND_FETCHING if n in found]
        parts = {"all": runs}
        if solved:
            metric, threshold = solved
            parts = {
                "solved": [r for r in runs if (r["metrics"].get(metric) or 0) >= threshold],
                "not solved": [r for r in runs if (r["metrics"].get(metric) or 0) < threshold],
            }
        for outcome, part in parts.items():
            if not part:
                continue
            heads = [[row.get("role") for row in r["head_analysis"]["rows"]] for r in part]
            out.append(
                {
                    "group": dict(zip(keys, values, strict=True)),
                    "outcome": outcome,
                    "runs": len(part),
                    "roles": {
                        name: {
                            **inference.solve_rate([float(name in h) for h in heads], 1.0),
                            "heads": sum(h.count(name) for h in heads) / len(heads),
                        }
                        for name in names
                    },
                }
            )
    return out
