"""Records you can trust: the same data gives the same tokenizer on any machine; a run directory keeps what a reload
needs and belongs to one run; what headlab reads back from a run directory it did not write cannot act on the
reader's machine; corrupt records are reported, not tracebacks."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import PACKED, SMALL_ANALYSIS, TESTS, as_interrupted, cli_env, cli_here, train_here
from headlab.data import subwords
from headlab.heads import head_view
from headlab.launch.plan import pack_key
from headlab.record import same_run
from headlab.stats.comparison import varying_keys

FAULTS_ENV = cli_env() | {"PYTHONPATH": str(TESTS)}
WORDS = ["film", "plot", "cast", "scene", "story", "score", "music", "actor", "script", "ending"]


def corpus(n: int, seed: int) -> list[tuple[str, int]]:
    """Sentences of the WORDS with a sentiment word that decides the label (many words of equal counts: ties)."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        words = rng.sample(WORDS, 4) + [rng.choice(["great", "fine", "superb"] if label else ["awful", "dull", "bad"])]
        rng.shuffle(words)
        rows.append((" ".join(words), label))
    return rows


def write_csv(path: Path, rows) -> None:
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))


TEXT = ["data=files", "model.d_model=16", "trainer.max_epochs=2", "logger=csv", "callbacks.progress_bar=null",
        *SMALL_ANALYSIS]  # fmt: skip


def test_the_subword_vocabulary_is_learned_by_the_most_frequent_pair_with_ties_broken_by_the_pair():
    counts = {"abc": 3, "abd": 3, "xy": 2}
    vocab, merges = subwords.learn(subwords.Counter(counts), 20, ["[PAD]"], prefix="##")
    # the special token, the alphabet sorted, then one token a merge: (a, ##b) occurs 6 times; (ab, ##c) and
    # (ab, ##d) 3 times each, the smaller pair first; (x, ##y) twice
    assert vocab == ["[PAD]", "##b", "##c", "##d", "##y", "a", "x", "ab", "abc", "abd", "xy"]
    assert merges == [("a", "##b"), ("ab", "##c"), ("ab", "##d"), ("x", "##y")]


def test_a_tokenizer_is_byte_identical_across_processes_hash_seeds_and_threads(tmp_path):
    rows = corpus(400, 0)
    (tmp_path / "texts.json").write_text(json.dumps([t for t, _ in rows]))
    code = (
        "import hashlib, json, sys\nfrom headlab.data.text_pipeline import make_tokenizer\n"
        f"texts = json.load(open({str(tmp_path / 'texts.json')!r}))\n"
        "for kind in ('wordpiece', 'bpe'):\n"
        "    config = {'kind': kind, 'vocab_size': 60, 'lowercase': True, 'path': None, 'hub': None}\n"
        "    print(hashlib.sha256(make_tokenizer(config, texts).to_str().encode()).hexdigest())\n"
    )
    outputs = set()
    for seed, threads in (("0", "1"), ("1", "2"), ("2", "4")):
        env = cli_env() | {"PYTHONHASHSEED": seed, "RAYON_NUM_THREADS": threads}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1 and len(outputs.pop().split()) == 2


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> Path:
    """A finished text run, trained with a cache of its own."""
    where = tmp_path_factory.mktemp("text")
    write_csv(where / "train.csv", corpus(300, 1))
    write_csv(where / "test.csv", corpus(60, 2))
    env = cli_env() | {"HEADLAB_CACHE": str(where / "cache")}
    done = train_here(
        *TEXT, f"data.files.train={where}/train.csv", f"data.files.test={where}/test.csv", "hydra.run.dir=run",
        cwd=where, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return where / "run"


def tool(name: str, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """headlab-<name> in this process (cli_here), in cwd (this process's by default)."""
    return cli_here(name, *args, cwd=cwd or Path.cwd(), env=env)


@pytest.mark.e2e
def test_a_text_run_keeps_its_tokenizer_labels_and_digests_and_every_reload_uses_them(text_run, tmp_path):
    record = json.loads((text_run / "results.json").read_text())
    kept = json.loads((text_run / "data" / "digests.json").read_text())
    assert record["data"]["digests"] == kept and set(kept) == {"splits", "files", "tokenizer"}
    tokenizer = (text_run / "data" / "tokenizer.json").read_bytes()
    assert kept["tokenizer"] == hashlib.sha256(tokenizer).hexdigest()
    assert json.loads((text_run / "data" / "labels.json").read_text()) == [0, 1]

    # another machine: an empty cache; the reload prepares the data with the run's tokenizer, and reads the same
    fresh = cli_env() | {"HEADLAB_CACHE": str(tmp_path / "elsewhere")}
    evaluated = tool("eval", str(text_run), env=fresh)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    again = json.loads((text_run / "eval" / f"test-{Path(record['checkpoints']['best']).stem}.json").read_text())
    assert again["metrics"]["test/acc"] == record["metrics"]["test/acc"]

    # a data file edited since: every reload refuses in one line (resume= takes an incomplete run: a copy)
    train = Path(record["config"]["data.files.train"])
    original = train.read_text()
    stopped = as_interrupted(Path(shutil.copytree(text_run, tmp_path / "stopped")))
    try:
        train.write_text(original + "an extra row,1\n")
        for run, done in (
            (text_run, tool("eval", str(text_run), env=fresh)),
            (text_run, tool("heads", str(text_run), env=fresh)),
            (stopped, train_here(f"resume={stopped}", cwd=tmp_path, env=fresh)),
        ):
            lines = [line for line in done.stderr.splitlines() if line.startswith("headlab-")]
            assert done.returncode != 0 and "Traceback" not in done.stderr
            assert len(lines) == 1 and f"data.files.train: {train} is not the file {run} trained on" in lines[0]
    finally:
        train.write_text(original)


@pytest.mark.e2e
def test_headlab_heads_probes_the_sentences_given_and_nothing_else(text_run, tmp_path):
    done = tool("heads", str(text_run), "--text", "a good film", "--text", "a dull one", "--out", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(2 probe examples)" in " ".join(done.stdout.split())
    # by position most keys of a sentence are "elsewhere": the last row says what attention spread evenly gives,
    # here counted by hand over the two sentences' real tokens (self, previous, next, first, elsewhere)
    page = (tmp_path / "a" / "view.html").read_text()
    data = json.loads(page.split("<script>const DATA = ")[1].split(";</script>")[0])
    lengths = [len(e["tokens"]) for e in data["examples"]]
    counts = [0.0] * 5
    for n in lengths:
        for i in range(n):
            for j in range(n):
                role = 0 if i == j else 1 if j == i - 1 else 2 if j == i + 1 else 3 if j == 0 else 4
                counts[role] += 1 / n / sum(lengths)
    uniform = next(line for line in done.stdout.splitlines() if "| uniform |" in line)  # a pipe: Markdown
    assert [int(c.strip().rstrip("%")) for c in uniform.split("|")[3:-1]] == [round(100 * c) for c in counts]
    assert data["roles"]["uniform"] == pytest.approx(counts, abs=1e-4)  # the head view's reference row
    more = tool("heads", str(text_run), "--text", "a good film", "--n-probe", "3", "--out", str(tmp_path / "b"))
    assert "(4 probe examples)" in " ".join(more.stdout.split())


def test_best_is_the_checkpoint_the_record_names(text_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(text_run, run)
    stray = run / "checkpoints" / "best-epoch9-step999.ckpt"  # sorts after the real one
    (run / "checkpoints" / "last.ckpt").rename(stray)
    record = json.loads((run / "results.json").read_text())
    done = tool("eval", str(run), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    best = Path(record["checkpoints"]["best"]).name
    assert json.loads((run / "eval" / f"test-{Path(best).stem}.json").read_text())["checkpoint"].endswith(best)
    stray.write_bytes(stray.read_bytes()[:1000])  # a checkpoint cut short, named on the command line
    cut = tool("eval", str(run), "--checkpoint", str(stray), cwd=tmp_path)
    assert cut.returncode == 1 and cut.stderr.strip().startswith(f"headlab-eval: {stray} is not a readable checkpoint")
    assert "Traceback" not in cut.stderr


@pytest.mark.e2e
def test_a_new_run_refuses_a_directory_holding_another_run_which_it_leaves_as_it_was(text_run, run_cli, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(text_run, run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    done = run_cli("model.d_model=8", "trainer.max_epochs=1", "logger=csv", f"hydra.run.dir={run}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"headlab-train: error: {run} holds another run's records (results.json (completed) and 2 checkpoint(s)): "
        f"choose another directory (hydra.run.dir=..., or hydra.sweep.dir=... for a sweep), or continue that run "
        f"with resume={run}"
    )
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert {k: v for k, v in before.items() if k.name not in (".lock", "train.log")} == {
        k: v for k, v in after.items() if k.name != "train.log"
    }


@pytest.mark.e2e
def test_how_a_run_or_its_sweep_is_launched_makes_no_other_run_pack_or_arm():
    """resume= and the whole sweep group (keys it gains later too) say how runs start: a sweep recorded before
    sweep.plan existed resumes its completed jobs, packs them with new ones and compares them as one arm."""
    run = {"model.attention.n_heads": 4, "optim.lr": 0.01, "seed": 0, "sweep.resume": False}
    later = {**run, "resume": "x", "sweep.resume": True, "sweep.plan.metric": "test/acc", "sweep.sequential.looks": 3}
    assert same_run(run, later) and pack_key(run) == pack_key(later)
    assert varying_keys([{"config": run}, {"config": later}]) == []
    assert not same_run(run, {**later, "optim.lr": 0.02}) and pack_key(run) != pack_key({**run, "model.d_model": 8})


def test_a_second_process_cannot_write_a_run_directory_that_another_is_writing(tmp_path):
    slow = ["data.n_train=20000", "model.d_model=16", "logger=csv", "callbacks.progress_bar=null", "hydra.run.dir=run"]
    first = subprocess.Popen(
        [sys.executable, "-m", "headlab.cli.train", *slow], cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not (tmp_path / "run" / "results.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        second = train_here("resume=run", cwd=tmp_path)
        assert second.returncode == 2
        assert f"{tmp_path / 'run'} is being written by another process (pid {first.pid})" in second.stderr
        assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "running"
    finally:
        first.terminate()
        first.wait(timeout=120)


@pytest.mark.e2e
def test_a_run_directory_cannot_make_a_reader_build_what_headlab_would_not(text_run, run_cli, tmp_path):
    """A crafted .hydra/config.yaml naming builtins.open (it would truncate the victim file) is refused by
    headlab-eval, headlab-heads and resume=, and the victim stays whole; so is an output path outside the run."""
    run = tmp_path / "run"
    shutil.copytree(text_run, run)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    config = run / ".hydra" / "config.yaml"
    original = config.read_text()
    config.write_text(original.replace("_target_: headlab.data.text.TextDataModule", "_target_: builtins.open"))
    crafted = (
        f"headlab-eval: data._target_='builtins.open' is invalid: expected a class that headlab's own configs name "
        f"({config} is not trusted to name others; give the key on the command line to run it)"
    )
    assert tool("eval", str(run), cwd=tmp_path).stderr.strip() == crafted
    assert tool("heads", str(run), cwd=tmp_path).stderr.strip() == crafted.replace("headlab-eval", "headlab-heads")
    resumed = run_cli(f"resume={run}")
    assert resumed.returncode == 2 and "data._target_='builtins.open' is invalid" in resumed.stderr
    assert victim.read_text() == "precious"

    config.write_text(
        original.replace("default_root_dir: ${hydra:runtime.output_dir}", f"default_root_dir: {tmp_path}")
    )
    outside = run_cli(f"resume={run}")
    assert outside.returncode == 2
    assert (
        f"trainer.default_root_dir='{tmp_path}' is invalid: expected a path inside the run directory" in outside.stderr
    )


def test_a_run_still_training_is_not_evaluated_until_it_ends(text_run, tmp_path):
    """headlab-eval and headlab-heads on a run whose lock another process holds (it trains) refuse in one line:
    last.ckpt and the records would be of different epochs."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(text_run / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); os.ftruncate(fd, 0); os.write(fd, str(os.getpid()).encode())\n"
         "print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        for name in ("eval", "heads"):
            refused = tool(name, str(text_run), "--checkpoint", "last") if name == "eval" else tool(name, str(text_run))
            assert refused.returncode == 1 and refused.stderr.strip() == (
                f"headlab-{name}: {text_run} is being written by another process (pid {holder.pid}); wait for it to end"
            )
    finally:
        holder.kill()
        holder.wait()
    assert tool("eval", str(text_run), "--checkpoint", "last").returncode == 0  # once it has ended


@pytest.mark.e2e
def test_a_finished_job_of_a_sweep_is_readable_while_the_sweep_goes_on(tmp_path):
    """A sweep's job 0 ends and job 1 trains on: job 0's lock ends with it, so headlab-heads and headlab-eval read
    it at once, not when the sweep ends."""
    quick = ["model.d_model=16", "trainer.max_epochs=1", "logger=csv", "callbacks.progress_bar=null"]
    command = [sys.executable, "-m", "headlab.cli.train", "-m", *quick, "data.n_train=256,400000",
               "hydra.sweep.dir=sweep"]  # fmt: skip
    sweep = subprocess.Popen(command, cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        first = tmp_path / "sweep" / "0"
        deadline = time.time() + 240
        while time.time() < deadline and sweep.poll() is None:
            if (json.loads((first / "results.json").read_text()) if (first / "results.json").is_file() else {}).get(
                "status"
            ) == "completed" and (tmp_path / "sweep" / "1" / "results.json").is_file():
                break
            time.sleep(0.2)
        assert sweep.poll() is None, "the sweep ended before its second job could be seen training"
        for name in ("heads", "eval"):
            done = tool(name, str(first), cwd=tmp_path)
            assert done.returncode == 0, done.stderr[-2000:]
        assert sweep.poll() is None  # read while job 1 still trained
    finally:
        os.killpg(sweep.pid, signal.SIGKILL)
        sweep.wait()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("logger.csv.name", "../../../outside"),
        ("callbacks.model_checkpoint.filename", "../../../../elsewhere/best"),
        ("logger.tensorboard.version", "/tmp/absolute"),
    ],
)
def test_a_received_config_names_no_file_outside_its_run(tmp_path, key, value):
    """resume= of a received run: a name a logger or a callback joins to its folder cannot leave the run (the
    folders themselves are checked as paths); a plain name is fine."""
    from omegaconf import OmegaConf

    from headlab.config import trust
    from headlab.errors import ConfigError

    cfg = OmegaConf.create({})
    OmegaConf.update(cfg, key, value, force_add=True)
    with pytest.raises(ConfigError, match=rf"^{key}='{value}' is invalid: expected a name inside its folder"):
        trust.check_paths(cfg, tmp_path)
    OmegaConf.update(cfg, key, "best-{epoch}", force_add=True)
    trust.check_paths(cfg, tmp_path)


def test_the_head_view_page_holds_any_string_inside_its_script():
    hostile = "</script><!--<script>alert(1)</script>&\u2028"
    data = {"title": hostile, "tokens": [hostile, "<b>"], "n": 1}

    class Scripts(HTMLParser):
        def __init__(self):
            super().__init__()
            self.scripts, self.inside = [], False

        def handle_starttag(self, tag, attrs):
            if tag == "script":
                self.inside = True
                self.scripts.append("")

        def handle_endtag(self, tag):
            self.inside = self.inside and tag != "script"

        def handle_data(self, text):
            if self.inside:
                self.scripts[-1] += text

    page = f"<html><script>const DATA = {head_view.script_json(data)};</script></html>"
    parser = Scripts()
    parser.feed(page)
    (script,) = parser.scripts  # one script, whole: nothing in the data ended it or opened another
    assert json.loads(script.removeprefix("const DATA = ").removesuffix(";")) == data


@pytest.mark.e2e
def test_a_declared_class_count_turns_a_single_class_into_a_recorded_warning(tmp_path):
    write_csv(tmp_path / "train.csv", [(t, 1) for t, _ in corpus(60, 3)])
    done = train_here(
        *TEXT, "trainer.max_epochs=1", f"data.files.train={tmp_path}/train.csv", "data.n_classes=2",
        "hydra.run.dir=run", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["data"]["warnings"] == ["every training label is 1: one of the 2 declared classes"]


@pytest.mark.e2e
@pytest.mark.parametrize("damage", ["truncated", "null", "list"])
def test_a_corrupt_results_json_is_reported_never_a_traceback(text_run, run_cli, tmp_path, damage):
    run = tmp_path / "sweep" / "0"
    shutil.copytree(text_run, run)
    text = (run / "results.json").read_text()
    (run / "results.json").write_text({"truncated": text[: len(text) // 2], "null": "null", "list": "[]"}[damage])

    changed = run_cli(f"resume={run}", "model.d_model=8")  # compared with .hydra/config.yaml
    assert changed.returncode == 2 and "model.d_model=8 is invalid: expected 16 as in the run being resumed" in (
        changed.stderr
    )
    compared = tool("compare", str(tmp_path / "sweep"), cwd=tmp_path)
    assert compared.returncode == 1 and "Traceback" not in compared.stderr
    assert f"skipped {run}/results.json: " in compared.stderr
    resumed = train_here(f"resume={run}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["status"] == "completed"


@pytest.mark.e2e
def test_a_packed_sweep_signalled_while_preparing_its_data_records_every_member_as_interrupted(tmp_path):
    """The first preparation is the launcher's, timing each pack's model for the sweep's first line before any pack
    begins; a pack's own comes next. Signalled in either, every member says so and resumes."""
    marker = tmp_path / "preparing"
    command = [
        sys.executable, "-m", "headlab.cli.train", "-m", *PACKED, "seed=0,1",
        "data.task._target_=faults.WaitingTask", f"+data.task.marker={marker}", "logger=csv", "hydra.sweep.dir=sweep",
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=tmp_path, env=FAULTS_ENV, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM and b"Traceback" not in stderr
    statuses = [json.loads((tmp_path / "sweep" / str(i) / "results.json").read_text())["status"] for i in (0, 1)]
    assert statuses == ["interrupted", "interrupted"]


def make_unreadable(path: Path, kind: str) -> None:
    """path replaced by what a received run directory may hold instead of a record."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if kind == "pipe":
        os.mkfifo(path)  # opened for reading, it blocks until a writer comes
    elif kind == "endless":
        path.symlink_to("/dev/zero")  # read, it never ends
    elif kind == "folder":
        path.mkdir()
    else:  # 65 MiB of nothing (a sparse file): over the size a record may be
        with path.open("wb") as f:
            f.truncate(65 * 2**20)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["pipe", "endless", "folder", "huge"])
def test_a_received_record_that_is_no_plain_file_is_refused_before_it_is_read(text_run, run_cli, tmp_path, kind):
    """A pipe would block a reader, /dev/zero never end, a huge file exhaust memory: every reader of a received
    run looks before it reads, and says so in one line (or leaves the file out)."""
    from headlab.record import read_record

    run = tmp_path / "sweep" / "0"
    shutil.copytree(text_run, run)
    make_unreadable(run / "results.json", kind)
    make_unreadable(run / "progress.json", kind)
    assert read_record(run) is None
    status = tool("status", str(run.parent), cwd=tmp_path)
    assert status.returncode == 0 and "unreadable" in status.stdout and "Traceback" not in status.stderr
    compared = tool("compare", str(run.parent), cwd=tmp_path)
    assert "Traceback" not in compared.stderr and f"skipped {run}/results.json" in compared.stderr

    make_unreadable(run / ".hydra" / "config.yaml", kind)
    heads = tool("heads", str(run), cwd=tmp_path)
    assert heads.returncode != 0 and "Traceback" not in heads.stderr
    assert heads.stderr.strip().splitlines()[-1].startswith(f"headlab-heads: {run}/.hydra/config.yaml is ")

    resumed = tmp_path / "resumed"
    shutil.copytree(text_run, resumed)
    as_interrupted(resumed)
    make_unreadable(resumed / "checkpoints" / "last.ckpt", kind)
    refused = run_cli(f"resume={resumed}")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    said = refused.stderr.strip().splitlines()[-1]
    assert said.startswith("headlab-train: invalid config: resume=") and "last.ckpt" in said
    assert kind == "huge" or "expected a plain file" in said  # a large file is read as a checkpoint: not one
