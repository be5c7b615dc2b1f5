"""The layout is the architecture: science below data below training below the command line, nothing upward."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from headlab.conventions import CHOICES

SRC = Path(__file__).parents[1] / "src" / "headlab"
DOCS = Path(__file__).parents[1] / "docs"
LAYERS = {"conventions": 0, "errors": 0, "model": 1, "analysis": 1, "data": 2, "training": 3, "cli": 4}
FRAMEWORKS = ("lightning", "hydra", "wandb", "datasets", "omegaconf", "torchmetrics", "pytorch_lightning")


def layer(module: str) -> int:
    """headlab.<package>... -> the rank of its layer."""
    return LAYERS[module.split(".")[1].removesuffix(".py")]


def imports(path: Path) -> set[str]:
    """Every headlab module a file imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("headlab.")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("headlab."):
            found.add(node.module)
    return found


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts == ("__init__",):
            continue
        here = "headlab." + ".".join(parts)
        upward += [f"{here} -> {m}" for m in imports(path) if layer(m) > layer(here)]
    assert upward == []


def test_the_science_imports_without_any_framework():
    """headlab.model and headlab.analysis, every module of them, with the frameworks made unimportable (the
    Triton kernels where Triton is installed: it comes with CUDA builds of torch)."""
    modules = sorted(
        "headlab." + ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        for package in ("model", "analysis")
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


def test_docs_and_code_refer_to_nothing_outside_the_repository():
    texts = [p.read_text() for p in [*SRC.rglob("*.py"), *DOCS.glob("*.md"), Path(__file__).parents[1] / "README.md"]]
    assert not [t for t in texts if "DESIGN.md" in t]
