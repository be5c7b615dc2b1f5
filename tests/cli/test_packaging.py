"""conf/ and experiments/ are found from an installed wheel, not only from the source checkout."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.e2e


def test_wheel_ships_every_config_group(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path, ROOT],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(tmp_path.glob("headlab-*.whl"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    shipped = {
        p.relative_to(target / "headlab" / "conf").as_posix() for p in (target / "headlab" / "conf").rglob("*.yaml")
    }
    in_repo = {p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*.yaml")}
    in_repo |= {f"experiment/{p.name}" for p in (ROOT / "experiments").glob("*.yaml")}  # conf/experiment links there
    assert shipped == in_repo and any(s.startswith("experiment/") for s in shipped)
    assert (
        target / "headlab" / "model" / "kernels" / "additive.c"
    ).is_file()  # the native kernels' source, built on use
    packages = {p.parent.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src").rglob("__init__.py")}
    assert {p for p in packages if not (target / p / "__init__.py").is_file()} == set()  # every package of src/

    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = subprocess.run(
        [sys.executable, "-c", "import headlab, sys; sys.argv[1:] = ['--help']; print(headlab.__file__);"
         "from headlab.cli.train import cli; cli()"],
        env=env, cwd=tmp_path, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.splitlines()[0].startswith(str(target))  # the wheel's copy, not the checkout
    for script in ("compare", "heads", "eval", "status", "bench", "sync"):  # each console script, from the wheel
        module = f"headlab.cli.{script}"
        answer = subprocess.run(
            [sys.executable, "-c", f"import sys; sys.argv[1:] = ['--help']; from {module} import main; main()"],
            env=env, cwd=tmp_path, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
        assert answer.returncode == 0 and "usage:" in answer.stdout, (script, answer.stderr[-2000:])
    experiments = next(line for line in probe.stdout.splitlines() if line.startswith("experiment:"))
    assert (
        "heads_vs_depth" in experiments
        and "listops, mpqa, mqar, mr, pair_recall, sst2, sst5, subj, trec" in probe.stdout
    )


def test_the_viewers_the_readme_shows_come_with_the_install_a_user_runs():
    """`make install` installs headlab without extras: TensorBoard, which the README shows as a place to look, is
    among its own requirements, not only the tests'."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(r.split(">")[0].split("=")[0].strip() == "tensorboard" for r in project["dependencies"])
    assert "tensorboard --logdir" in (ROOT / "README.md").read_text()
