"""The layout is the architecture: science below data below training below the command line, nothing upward."""

import ast
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from headlab.data.text_pipeline import TOKENIZERS
from headlab.errors import InvalidSetting
from headlab.model import rules

ROOT = Path(__file__).parents[1]
SRC = ROOT / "src" / "headlab"
DOCS = ROOT / "docs"
README = ROOT / "README.md"
CHOICES = {  # every key that is a choice among names: the model or the data raises with these, the docs list them
    "model.norm": rules.NORMS,
    "model.positional": rules.POSITIONALS,
    "model.readout": (None, *rules.READOUTS),
    "model.attention.scoring": tuple(rules.stage_names("scoring")),
    "model.attention.normalizer": tuple(rules.stage_names("normalizer")),
    "model.attention.gate": tuple(rules.stage_names("gate")),
    "model.attention.talking_heads": rules.TALKING_HEADS,
    "data.tokenizer.kind": TOKENIZERS,
}
LAYERS = {  # headlab.<package> -> its rank; hydra_plugins (shells over headlab.launch) between launch and cli
    **{
        "conventions": 0,
        "errors": 0,
        "escape": 0,
        "files": 0,
        "printing": 0,
        "record": 0,
        "timing": 0,
        "model": 1,
        "heads": 1,
        "stats": 1,
    },
    **{"data": 2, "config": 2.5, "training": 3, "launch": 4, "compare": 4, "hydra_plugins": 4.5, "cli": 5},
}
FRAMEWORKS = ("lightning", "hydra", "wandb", "datasets", "omegaconf", "torchmetrics", "pytorch_lightning")


def layer(module: str) -> float:
    """headlab.<package>... (or hydra_plugins...) -> the rank of its layer."""
    parts = module.split(".")
    return LAYERS["hydra_plugins" if parts[0] == "hydra_plugins" else parts[1]]


def import_graph() -> dict[str, set[str]]:
    """Every module of src/ -> the modules of src/ it imports, at module level or inside functions (`from package
    import module` is an import of the module; a package's __init__ counts only where a name of its own is taken)."""
    names = {
        ".".join(p.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in SRC.parent.rglob("*.py")
    }
    graph = {}
    for name, path in names.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom) and node.module in names:
                modules = {f"{node.module}.{a.name}" for a in node.names} & set(names)
                found |= modules | ({node.module} if len(modules) < len(node.names) else set())
        graph[name] = found - {name}
    return graph


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{m} -> {d}" for m, deps in import_graph().items() for d in deps if layer(d) > layer(m)]
    assert upward == []


def test_the_import_graph_has_no_circle():
    """No module reaches itself through its imports (Tarjan's strongly connected components of the graph)."""
    graph, index, low, stack, circles = import_graph(), {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_the_hydra_plugins_import_from_headlab_launch_alone_and_only_inside_their_methods():
    """Hydra's scan imports every plugin module on every start: it reaches no headlab module, so the package-level
    pair headlab.cli -> hydra_plugins -> headlab.launch closes no circle even at import time."""
    graph = import_graph()
    reached = {d for m, deps in graph.items() if m.startswith("hydra_plugins") for d in deps if d.startswith("headlab")}
    assert {d.split(".")[1] for d in reached} == {"launch"}
    at_import = [
        f"{path.name}: {node.module}"
        for path in (SRC.parent / "hydra_plugins").rglob("*.py")
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("headlab")
    ]
    assert at_import == []


def test_the_command_line_layer_is_arguments_and_rendering():
    """cli/ (without the benchmarks) stays under 1,500 lines: a run's life, packs, SLURM and the statistics live in
    the layers below it."""
    lines = sum(len(p.read_text().splitlines()) for p in (SRC / "cli").glob("*.py"))
    assert lines < 1500


def test_the_science_imports_without_any_framework():
    """headlab.model, headlab.heads and headlab.stats, every module of them, with the frameworks made unimportable (the
    Triton kernels where Triton is installed: it comes with CUDA builds of torch)."""
    modules = sorted(
        "headlab." + ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        for package in ("model", "heads", "stats")
        for p in (SRC / package).rglob("*.py")
        if p.stem != "additive_triton" or importlib.util.find_spec("triton")
    )
    code = (
        f"import sys\nfor name in {FRAMEWORKS!r}: sys.modules[name] = None\n"
        f"import importlib\nfor m in {modules!r}: importlib.import_module(m)\n"
        "from headlab.model import Encoder, MultiHeadAttention\nprint(len(sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_the_configuration_reference_lists_each_choice(key):
    """The allowed values the model and the config check use are those docs/configuration.md gives."""
    row = next(line for line in (DOCS / "configuration.md").read_text().splitlines() if line.startswith(f"| `{key}`"))
    words = set(row.replace(",", " ").replace("`", " ").replace("|", " ").split())
    assert [a for a in CHOICES[key] if ("null" if a is None else a) not in words] == []


def test_no_source_file_is_over_400_lines():
    """One idea a file: a module that grows past 400 lines holds several."""
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_no_function_of_the_run_and_launch_layers_is_over_80_lines():
    """A job's and a run's life read a step at a time: no function in launch/ or training/ over 80 lines."""
    long = {}
    for path in [*(SRC / "launch").rglob("*.py"), *(SRC / "training").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 80:
                long[f"{path.relative_to(SRC)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert long == {}


def test_an_unknown_scoring_raises_naming_the_ones_there_are():
    from headlab.model import MultiHeadAttention

    with pytest.raises(InvalidSetting, match=r"scoring='cosine' is invalid: expected one of additive, dot"):
        MultiHeadAttention(16, 2, scoring="cosine")


def _targets() -> list[tuple[str, str, DictConfig]]:
    """(file, key, node) of every config node of conf/ that instantiates one of headlab's own classes."""
    found = []

    def walk(node, key, file):
        if isinstance(node, DictConfig):
            if str(node.get("_target_", "")).startswith("headlab."):
                found.append((file, key, node))
            for k, v in node.items_ex(resolve=False):
                walk(v, f"{key}.{k}" if key else str(k), file)

    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        walk(OmegaConf.load(path), "", str(path.relative_to(ROOT)))
    return found


def _defaults(target: str) -> dict:
    module, _, name = target.rpartition(".")
    obj = getattr(importlib.import_module(module), name)
    return {
        k: p.default for k, p in inspect.signature(obj).parameters.items() if p.default is not inspect.Parameter.empty
    }


def _disagreements(node: DictConfig, defaults: dict) -> dict:
    out = {}
    for key, value in node.items_ex(resolve=False):
        if key not in defaults or OmegaConf.is_interpolation(node, key) or isinstance(value, DictConfig):
            continue
        plain = OmegaConf.to_object(value) if OmegaConf.is_config(value) else value
        default = list(defaults[key]) if isinstance(defaults[key], tuple) else defaults[key]
        if plain != default:
            out[key] = (plain, defaults[key])
    return out


def test_every_python_default_agrees_with_the_configs():
    """A default is stated once in substance: where a config and the class it instantiates both give a value, they
    are the same (the encoder's attention and the optimiser's settings too)."""
    disagree = {}
    for file, key, node in _targets():
        for name, pair in _disagreements(node, _defaults(node._target_)).items():
            disagree[f"{file}: {key}.{name}" if key else f"{file}: {name}"] = pair
    model = OmegaConf.load(ROOT / "conf" / "model" / "encoder.yaml")
    attention = _disagreements(model.attention, _defaults("headlab.model.attention.MultiHeadAttention"))
    optim = _disagreements(
        OmegaConf.load(ROOT / "conf" / "train.yaml").optim, _defaults("headlab.training.module.HeadLabModule")
    )
    disagree |= {f"model.attention.{k}": v for k, v in attention.items()}
    disagree |= {f"optim.{k}": v for k, v in optim.items()}
    assert disagree == {}


def test_docs_and_code_refer_to_nothing_outside_the_repository():
    texts = [p.read_text() for p in [*SRC.rglob("*.py"), *DOCS.glob("*.md"), README]]
    assert not [t for t in texts if "DESIGN.md" in t]


def test_the_readmes_python_example_runs_as_written_and_says_its_shapes_right():
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    (b, n, d), h = scope["x"].shape, scope["mha"].n_heads
    assert scope["out"].shape == (b, n, d)
    assert scope["weights"].shape == (b, h, n, n)
    assert torch.allclose(scope["weights"].sum(-1), torch.ones(b, h, n))  # after softmax
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--config", str(ROOT / "pyproject.toml"), "-"],
        input=example,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert formatted == example


def test_the_repository_root_holds_the_projects_files_only():
    """Outputs (a compare table, figures, runs) belong under experiments/results or outputs/, never at the root."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    top = {line.split("/", 1)[0] for line in tracked.splitlines()}
    project = {".ci", ".gitignore", "BENCHMARKS.md", "Makefile", "README.md", "pyproject.toml"}
    project |= {"conf", "docs", "experiments", "src", "sweeps", "tests"}
    assert top - project == set()


WRITERS_ELSEWHERE = {  # files that write without headlab.files, and why that is whole-or-nothing too
    "files.py": "the atomic writer itself",
    "data/text_pipeline.py": "a cache entry written into a temporary folder that one os.replace puts in place",
    "cli/bench/memory_probe.py": "/proc/self/clear_refs, a kernel control file",
    "cli/bench/commands.py": "a slice of SST-2 in the benchmark's own temporary folder",
    "launch/rundir.py": "the sweep's journal of refused jobs: one short line appended (O_APPEND) by each refusing job",
    "launch/tensorboard.py": "the sweep's TensorBoard view: links (or copies) of event files in a folder made anew",
    "../hydra_plugins/headlab_launcher/search_sweeper.py": "multirun.yaml, Hydra's own, as its basic sweeper writes it",
}


def _writes(path: Path) -> list[str]:
    """The calls in a module that write a file: .write_text/.write_bytes, open or .open with a literal mode that
    writes or appends, savefig but into an in-memory buffer, OmegaConf.save, shutil's copies."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        modes = [a.value for a in [*node.args, *(k.value for k in node.keywords if k.arg == "mode")]
                 if isinstance(a, ast.Constant) and isinstance(a.value, str)]  # fmt: skip
        opened = name == "open" and any(set(m) & set("wax") and len(m) <= 3 for m in modes)
        called = ast.unparse(node.func)
        saved = (name == "save" and called.startswith("OmegaConf")) or called.startswith("shutil.copy")
        to_file = name == "savefig" and not (node.args and ast.unparse(node.args[0]) == "buffer")  # in memory
        if name in ("write_text", "write_bytes") or opened or saved or to_file:
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node.func)}")
    return found


def test_every_file_headlab_writes_is_written_whole_or_not_at_all():
    """A kill, Ctrl-C or a full disk never leaves half a file: every write goes through headlab.files (a temporary
    file renamed into place), but for the modules above, each with its reason."""
    sources = [*SRC.rglob("*.py"), *(SRC.parent / "hydra_plugins").rglob("*.py")]
    writes = {p: _writes(p) for p in sources if Path(os.path.relpath(p, SRC)).as_posix() not in WRITERS_ELSEWHERE}
    assert [w for found in writes.values() for w in found] == []
    assert all(_writes(SRC / p) for p in WRITERS_ELSEWHERE if p != "files.py")  # each exception still writes


def test_the_readme_reads_in_one_sitting():
    """A person's first page: at most 250 lines; the rest is in docs/."""
    assert len(README.read_text().splitlines()) <= 250
