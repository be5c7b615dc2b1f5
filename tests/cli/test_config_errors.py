"""Bad input, systematically: every invalid configuration or input below, given to the CLI, exits non-zero
with one line on stderr naming the problem, no traceback, and no results.json that claims success. The cases run
the CLI's entry in the test process; one of each way to be refused early runs as a real process too."""

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from conftest import ROOT, cli_env, headlab_train, train_here
from headlab.cli.hydra_errors import one_line, refused_override
from headlab.config.check import check_config, check_launch
from headlab.errors import ConfigError, as_written
from headlab.model.encoder import Encoder
from headlab.training.pack import train as pack_train
from headlab.training.pack.train import train_run


@dataclass
class Case:
    id: str
    args: list[str]
    message: str  # the one line on stderr, after "headlab-train: "; {tmp} stands for the test's directory
    files: dict[str, str] = field(default_factory=dict)  # written into the test's directory first
    fast: bool = True  # rejected before torch, Lightning or the data are imported
    run_dir: str = "run"  # where the job runs (a resumed run runs in the directory it resumes)


def value(override: str, rule: str) -> Case:
    key, _, given = override.partition("=")
    shown = given if given.lstrip("-").replace(".", "", 1).isdigit() else repr(given)
    return Case(override, [override], f"invalid config: {key}={shown} is invalid: expected {rule}")


def unknown(group: str, options: str) -> Case:
    return Case(
        f"{group}=nope", [f"{group}=nope"], f"invalid config: {group}=nope is unknown: expected one of {options}"
    )


FILES = ["data=files", "data.files.train={tmp}/train.csv", "data.n_classes=2"]
GOOD_CSV = "text,label\n" + "".join(f"word{i} word{i + 1},{i % 2}\n" for i in range(40))

CASES = [
    # bad types and out-of-range values
    value("model.attention.n_heads=0", "an int >= 1"),
    value("model.attention.n_heads=abc", "an int >= 1"),
    value("model.d_model=-8", "an int >= 1"),
    value("model.attention.d_k=0", "an int >= 1 or null"),
    value("model.attention.scoring=cosine", "one of additive, dot"),
    value("model.attention.scale=maybe", "true or false"),
    value("model.readout=sum", "one of null, cls, mean, max, token"),
    value("model.dropout=1.0", "a number in [0, 1)"),
    value("model.attention.dropout=-0.1", "a number in [0, 1)"),
    value("model.norm=middle", "one of post, pre"),
    value("data.task.n_queries=0", "an int >= 1"),
    value("data.batch_size=1.5", "an int >= 1"),
    value("optim.lr=-1", "a number > 0"),
    value("optim.warmup=2", "a number in [0, 1)"),
    value("optim.sam_rho=-0.05", "a number >= 0 (0: plain AdamW steps)"),
    value("optim.rdrop=-1", "a number >= 0 (0: one pass a batch, no consistency term)"),
    value("trainer.max_epochs=0", "an int >= 1, or auto (auto_epochs)"),
    value("trainer.max_epochs=often", "an int >= 1, or auto (auto_epochs)"),
    value("seed=x", "an int in [0, 2**32)"),
    value("seed=-1", "an int in [0, 2**32)"),
    value("seed=4294967296", "an int in [0, 2**32)"),
    value("callbacks.attention.every_n_val_epochs=0", "an int >= 1"),
    value("callbacks.attention.pruning_step=0", "a number in (0, 1]"),
    value("callbacks.attention.n_probe=-1", "an int >= 1"),
    value("trainer.log_every_n_steps=0", "an int >= 1"),
    value("trainer.deterministic=maybe", "true, false, warn or null"),
    value("trainer.devices=x", "an int >= 1, -1 (every device), auto, or device indices ([0, 1] or '0,1')"),
    Case(
        "data.n_classes=x",
        ["data=sst2", "data.n_classes=x"],
        "invalid config: data.n_classes='x' is invalid: expected an int >= 2, or null (from the labels)",
    ),
    value("sweep.resume=maybe", "true or false"),
    Case(
        "a path that reads as a number",
        ["data=files", "data.files.train=5"],
        "invalid config: data.files.train=5 is invalid: expected a path, or null (quote one that reads as a number: "
        "'5')",
    ),
    Case(
        "a task's class that names no module",
        ["data.task._target_=5"],
        "invalid config: data.task._target_='5' is invalid: expected an importable task class (Empty module name)",
    ),
    value("trainer.enable_model_summary=maybe", "true or false"),
    *[
        Case(
            given,
            [given],
            f"invalid config: {given} is invalid: expected a run directory of headlab-train (with "
            ".hydra/config.yaml or checkpoints/last.ckpt)",
        )
        for given in ("resume=5", "resume=[a]", "resume={{a:1}}")  # {{: the case's {tmp} is formatted in
    ],  # fmt: skip
    value("trainer.gradient_clip_val=-1", "a number >= 0 or null"),
    value("tf32=maybe", "true or false"),
    value("pack.compute=vmap", "one of auto, each, batched"),
    value("sweep.extend.factor=1", "a number > 1 (past the top: x factor; the bottom: /)"),
    value("sweep.extend.factor=0.5", "a number > 1 (past the top: x factor; the bottom: /)"),
    value("model.attention.normalizer=relu", "one of sigmoid, sink, softmax, softmax1, softpick, ssmax"),
    value("model.attention.gate=channel", "one of elementwise, headwise, none"),
    value("model.attention.talking_heads=yes", "one of none, pre, post, both"),
    value("model.attention.differential=maybe", "true or false"),
    value("model.attention.latent_kv=0", "an int >= 1 (the latent's rank) or null"),
    value("model.positional=relative", "one of sinusoidal, learned, rope, alibi"),
    value("sweep.plan.budget=soon", "a duration: 30m, 2h, 1h30m, 90s"),
    value("sweep.sequential.looks=1", "an int >= 2 (rounds) or null"),
    value("sweep.sequential.alpha=1.5", "a number between 0 and 1"),
    value("sweep.plan.effect=-1", "a number > 0 (the difference that matters)"),
    value("sweep.plan.baseline=plain", "KEY=VALUE, e.g. --baseline design=plain"),
    value("model.rope_base=1", "a number > 1 (rotary angles base^(-2i/d_k))"),
    value("model.attention.value_residual=maybe", "true or false"),
    value("callbacks.attention.causal_batches=-1", "an int >= 0 (0: no causal analysis)"),
    # a run's checkpoints, which headlab writes itself: every setting as shipped (check_callbacks)
    *[
        Case(
            override,
            [override],
            f"invalid config: {key}={shown} is invalid: expected {allowed} (headlab writes a run's checkpoints "
            "itself: its best by val/acc, and last.ckpt after every validation)",
        )
        for override, key, shown, allowed in [
            (
                "callbacks.model_checkpoint.monitor=val/loss",
                "callbacks.model_checkpoint.monitor",
                "'val/loss'",
                "'val/acc'",
            ),
            ("callbacks.model_checkpoint.mode=min", "callbacks.model_checkpoint.mode", "'min'", "'max'"),
            ("callbacks.model_checkpoint.save_top_k=3", "callbacks.model_checkpoint.save_top_k", "3", "1"),
            ("callbacks.last_checkpoint.filename=final", "callbacks.last_checkpoint.filename", "'final'", "'last'"),
            (
                "+callbacks.last_checkpoint.every_n_epochs=2",
                "callbacks.last_checkpoint.every_n_epochs",
                "2",
                "the key left out",
            ),
            ("callbacks.model_checkpoint=null", "callbacks.model_checkpoint", "null", "the shipped checkpoint"),
            (
                "+callbacks.mine._target_=lightning.pytorch.callbacks.ModelCheckpoint",
                "callbacks.mine._target_",
                "'lightning.pytorch.callbacks.ModelCheckpoint'",
                "another callback",
            ),
        ]
    ],
    Case(
        "+callbacks.x=3",
        ["+callbacks.x=3"],
        "invalid config: callbacks.x=3 is invalid: expected a callback's config (its _target_ and arguments), or null",
    ),
    # Lightning's callbacks that would set what the config states, unsaid by the run's record
    *[
        Case(
            f"+callbacks.x._target_=lightning.pytorch.callbacks.{name}",
            [f"+callbacks.x._target_=lightning.pytorch.callbacks.{name}", *settings],
            f"invalid config: callbacks.x._target_='lightning.pytorch.callbacks.{name}' is invalid: expected another "
            f"callback (it would train with {sets})",
        )
        for name, settings, sets in [
            (
                "StochasticWeightAveraging",
                ["+callbacks.x.swa_lrs=0.01"],
                "a learning-rate schedule of its own, where "
                "headlab's sets the rate (optim.warmup, cosine): EMAWeightAveraging averages the weights alone",
            ),
            ("LearningRateFinder", [], "a learning rate of its choosing: sweep optim.lr"),
            ("BatchSizeFinder", [], "a batch size of its choosing: set data.batch_size"),
        ]
    ],
    Case(
        "optim.betas=[0.9]",
        ["optim.betas=[0.9]"],
        "invalid config: optim.betas=[0.9] is invalid: expected two numbers in [0, 1), e.g. [0.9, 0.98]",
    ),
    # a section given one value, a list in place of keys or keys in place of a list, a key below one value
    value("optim=5", "keys of its own: set one of them as optim.<key>=..."),
    value("sweep.plan=soon", "keys of its own: set one of them as sweep.plan.<key>=..."),
    value("model.attention=4", "keys of its own: set one of them as model.attention.<key>=..."),
    value("compare=5", "keys of its own or null: set one of them as compare.<key>=..."),
    Case(
        "logger.wandb=5",
        ["logger=wandb", "logger.wandb=5"],
        "invalid config: logger.wandb=5 is invalid: expected a logger's config (its _target_ and arguments), or null",
    ),
    Case(
        "a list in place of a section's keys",
        ["sweep.sequential=[1,2]"],
        "invalid config: sweep.sequential=[1,2] is invalid: expected keys of its own: set one of them as "
        "sweep.sequential.<key>=...",
    ),
    Case(
        "keys in place of a list",
        ["optim.betas={{a:1}}"],  # {tmp} is formatted into a case's arguments and message
        "invalid config: optim.betas={{a:1}} is invalid: expected two numbers in [0, 1), e.g. [0.9, 0.98]",
    ),
    Case(
        "a key of a launcher that has none",
        ["hydra.launcher.n_jobs=2"],
        "invalid config: hydra.launcher.n_jobs is not a key of the config: hydra.launcher has none to set",
    ),
    Case(
        "a key below one value",
        ["model.d_model.x=1"],
        "invalid config: model.d_model.x is not a key of the config: model.d_model is one value, with no keys of its "
        "own",
    ),
    Case(
        "max_pack=0",
        ["hydra.mode=MULTIRUN", "hydra/launcher=packed", "hydra.launcher.max_pack=0", "seed=0,1"],
        "invalid config: hydra.launcher.max_pack=0 is invalid: expected an int >= 1",
    ),
    Case(
        "packed n_jobs=0",
        ["hydra.mode=MULTIRUN", "hydra/launcher=packed", "hydra.launcher.n_jobs=0", "seed=0,1"],
        "invalid config: hydra.launcher.n_jobs=0 is invalid: expected an int >= 1 or auto",
    ),
    Case(
        "max_pack of another type",
        ["hydra.mode=MULTIRUN", "hydra/launcher=packed", "hydra.launcher.max_pack=abc", "seed=0,1"],
        "invalid config: hydra.launcher.max_pack='abc' is invalid: expected an int >= 1",
    ),
    Case(
        "packed n_jobs of another type",
        ["hydra.mode=MULTIRUN", "hydra/launcher=packed", "hydra.launcher.n_jobs=1.5", "seed=0,1"],
        "invalid config: hydra.launcher.n_jobs=1.5 is invalid: expected an int >= 1 or auto",
    ),
    Case(
        "a dry run's max_pack=0",
        ["hydra.mode=MULTIRUN", "hydra/launcher=packed", "hydra.launcher.max_pack=0", "seed=0,1", "--dry-run"],
        "invalid config: hydra.launcher.max_pack=0 is invalid: expected an int >= 1",
    ),
    Case(
        "a dry run's max_pack of another type",
        ["hydra.mode=MULTIRUN", "hydra/launcher=packed", "hydra.launcher.max_pack=abc", "seed=0,1", "--dry-run"],
        "invalid config: hydra.launcher.max_pack='abc' is invalid: expected an int >= 1",
    ),
    Case(
        "a dry run's n_jobs of another type",
        ["hydra.mode=MULTIRUN", "hydra/launcher=packed", "hydra.launcher.n_jobs=abc", "seed=0,1", "--dry-run"],
        "invalid config: hydra.launcher.n_jobs='abc' is invalid: expected an int >= 1 or auto",
    ),
    Case(
        "a model too large for memory",
        ["model.attention.d_k=1000000"],
        "invalid config: this model needs about ",
        fast=False,
    ),
    Case(
        "the data cache under a file",
        [*FILES, "data.cache_dir={tmp}/a_file/cache"],
        "data error: cannot write the data cache in {tmp}/a_file/cache (NotADirectoryError: ",
        files={"train.csv": GOOD_CSV, "a_file": "not a folder"},
        fast=False,
    ),
    Case(
        "integer labels with a stray word",
        ["data=files", "data.files.train={tmp}/train.csv"],
        "data error: the labels of {tmp}/train.csv (column 'label') are integers except in 1 row(s) (row 7: "
        "'positive'): fix those rows, or give every label as a word",
        files={"train.csv": GOOD_CSV.replace("word7 word8,1", "word7 word8,positive")},
        fast=False,
    ),
    Case(
        "a training file of one class",
        ["data=files", "data.files.train={tmp}/train.csv"],
        "data error: every training label is 1: one class, nothing to learn (declare data.n_classes if meant)",
        files={"train.csv": GOOD_CSV.replace(",0\n", ",1\n")},
        fast=False,
    ),
    Case(
        "a row without text",
        [*FILES],
        "data error: the train split of {tmp}/train.csv has no text in row 3 (column 'text')",
        files={"train.csv": GOOD_CSV.replace("word3 word4,1", ",1")},
        fast=False,
    ),
    Case(
        "an empty-text policy that does not exist",
        [*FILES, "data.empty_text=drop"],
        "invalid config: data.empty_text='drop' is invalid: expected refuse or keep",
        files={"train.csv": GOOD_CSV},
    ),
    Case(
        "a file format that does not exist",
        [*FILES, "data.files.format=xml"],
        "data error: data.files.format='xml' is invalid: expected one of csv, tsv, json, parquet, lines (label, ",
        files={"train.csv": GOOD_CSV},
    ),
    Case(
        "listops max_length",
        ["data=listops", "data.task.max_length=0"],
        "invalid config: data.task.max_length=0 is invalid: expected an int >= 1",
    ),
    # impossible combinations
    Case(
        "heads not dividing d_model",
        ["model.d_model=30"],
        "invalid config: model.attention.n_heads=4 is invalid: expected a divisor of model.d_model=30 while "
        "model.attention.d_k is null (or set d_k)",
    ),
    Case(
        "R-Drop without dropout",
        ["optim.rdrop=1"],
        "invalid config: optim.rdrop=1 is invalid: expected 0 while model.dropout and model.attention.dropout are 0 "
        "(R-Drop compares two dropout masks); set optim.rdrop=0 (text data's defaults set 3)",
    ),
    Case(
        "text defaults without dropout",
        [*FILES, "model.dropout=0"],
        "invalid config: optim.rdrop=3.0 is invalid: expected 0 while model.dropout and model.attention.dropout are "
        "0 (R-Drop compares two dropout masks); set optim.rdrop=0 (text data's defaults set 3)",
        files={"train.csv": GOOD_CSV},
    ),
    Case(
        "rope with additive scoring",
        ["+design=rope", "model.attention.scoring=additive"],
        "invalid config: model.attention.scoring='additive' is invalid: expected dot with model.positional=rope "
        "(rotary positions are relative through q . k; additive's are not), or model.positional=alibi",
    ),
    Case(
        "rope with an odd d_k",
        ["model.positional=rope", "model.attention.d_k=7"],
        "invalid config: model.attention.d_k=7 is invalid: expected an even number with model.positional=rope "
        "(rotary turns pairs)",
    ),
    Case(
        "mta with an even kernel",
        ["+design=mta", "model.attention.mta.query_kernel=4"],
        "invalid config: model.attention.mta.query_kernel=4 is invalid: expected an odd int >= 1 (a kernel centred "
        "on the logit)",
    ),
    Case(
        "moh routing every head",
        ["+design=moh", "model.attention.moh.k=3"],
        "invalid config: model.attention.moh.k=3 is invalid: expected an int in [1, 3) (routed heads on a token, of "
        "the 3 not shared)",
    ),
    Case(
        "moh with a negative load-balance weight",
        ["+design=moh_balance", "model.attention.moh.balance=-0.01"],
        "invalid config: model.attention.moh.balance=-0.01 is invalid: expected a number >= 0 (the load-balance "
        "loss's weight; 0: none)",
    ),
    Case(
        "mta's group norm not a bool",
        ["+design=mta_group_norm", "model.attention.mta.group_norm=rms"],
        "invalid config: model.attention.mta.group_norm='rms' is invalid: expected true or false",
    ),
    Case(
        "mta with talking heads",
        ["+design=mta", "model.attention.talking_heads=both"],
        "invalid config: model.attention.talking_heads='both' is invalid: expected none with model.attention.mta "
        "(it mixes heads itself)",
    ),
    Case(
        "value residual in one layer",
        ["+design=value_residual"],
        "invalid config: model.attention.value_residual=true is invalid: expected false while model.n_layers=1 "
        "(the first layer's values mix into later layers')",
    ),
    Case(
        "kv heads not dividing heads",
        ["model.attention.n_kv_heads=3"],
        "invalid config: model.attention.n_kv_heads=3 is invalid: expected a divisor of model.attention.n_heads=4",
    ),
    Case(
        "cls readout on a token task",
        ["model.readout=cls"],
        "invalid config: model.readout='cls' is invalid: expected token (or null) for this token-level task",
        fast=False,
    ),
    Case(
        "ddp_cpu with one device",
        ["trainer=ddp_cpu", "trainer.devices=1"],
        "invalid config: trainer.devices=1 is invalid: expected at least 2 with trainer.strategy=ddp_fork "
        "(or trainer=cpu for one process)",
    ),
    # unknown names in every config group, unknown keys, unparsable overrides
    unknown("data", "ag_news, cr, files, imdb, listops, mpqa, mqar, mr, pair_recall, sst2, sst5, subj, trec"),
    unknown("model", "encoder"),
    unknown("trainer", "cpu, ddp, ddp_cpu, gpu"),
    unknown("logger", "csv, none, tensorboard, wandb"),
    unknown("callbacks", "default"),
    unknown(
        "experiment",
        "differential_confound, fixed_head_size, head_designs, head_designs_2, head_pruning, head_roles, "
        "heads_fixed_width, heads_vs_depth, key_size, scoring, sst2_heads_fixed_width, sst2_recipe, sst2_scoring",
    ),
    unknown("hydra/launcher", "basic, joblib, local, packed, packed_slurm, slurm, submitit_local, submitit_slurm"),
    unknown("hydra/sweeper", "basic, grid, search"),
    # a config group given a value that is no name (a number, null, true; in a list, in a sweep's values too)
    *[
        Case(given, args, f"invalid config: {said} is unknown: expected one of {options}")
        for given, args, said, options in [
            ("trainer=5", ["trainer=5"], "trainer=5", "cpu, ddp, ddp_cpu, gpu"),
            ("model=null", ["model=null"], "model=null", "encoder"),
            ("logger=true", ["logger=true"], "logger=true", "csv, none, tensorboard, wandb"),
            ("logger=[csv,5]", ["logger=[csv,5]"], "logger=5", "csv, none, tensorboard, wandb"),
            ("+design=1.5", ["+design=1.5"], "design=1.5", "alibi, differential, differential_paper, "),
            (
                "hydra/launcher=5",
                ["hydra/launcher=5"],
                "hydra/launcher=5",
                "basic, joblib, local, packed, packed_slurm, slurm, submitit_local, submitit_slurm",
            ),
            ("a sweep's value", ["hydra.mode=MULTIRUN", "trainer=cpu,5"], "trainer=5", "cpu, ddp, ddp_cpu, gpu"),
        ]
    ],
    # a group a run needs, removed
    *[
        Case(given, [given], f"invalid config: {given} is invalid: expected a {group} config (a run needs one): ")
        for given, group in [("~model", "model"), ("trainer=[]", "trainer"), ("~data", "data")]
    ],
    Case(
        "+scoring=nope",
        ["+scoring=nope"],
        "invalid config: scoring=nope is unknown: expected one of additive, dot, dot_unscaled",
    ),
    Case(
        "an unknown logger in a list",
        ["logger=[csv,nope]"],
        "invalid config: logger=nope is unknown: expected one of csv, none, tensorboard, wandb",
    ),
    Case(
        "unknown key",
        ["model.heads=4"],
        "invalid config: model.heads is not a key of the config: expected one of d_model, n_layers, d_ff, "
        "dropout, norm, positional, rope_base, readout, compile, attention",
    ),
    Case(
        "added key the model does not take",
        ["+model.heads=4"],
        "invalid config: model.heads is not a key of the model: expected one of d_model, n_layers, d_ff, "
        "dropout, norm, positional, rope_base, readout, compile, attention",
    ),
    Case(
        "a misspelt key suggests the key meant",
        ["model.attention.gaet=headwise"],
        "invalid config: model.attention.gaet is not a key of the config: did you mean model.attention.gate? ",
    ),
    Case(
        "a misspelt key added with + is refused before training, with the key meant",
        ["+model.attention.gaet=headwise"],
        "invalid config: model.attention.gaet is not a key of the model: did you mean model.attention.gate? ",
    ),
    Case(
        "an unknown key of a trainer may be added",
        ["trainer.max_stepz=3"],
        "invalid config: trainer.max_stepz is not a key of the config: did you mean trainer.max_epochs? expected one "
        "of accelerator, devices, max_epochs, gradient_clip_val, log_every_n_steps, deterministic, "
        "enable_model_summary, default_root_dir (or +trainer.max_stepz=... to add one)",
    ),
    Case(
        "unparsable override",
        ["data.batch_size=[1"],
        "invalid override 'data.batch_size=[1': no viable alternative at input '[1'; See "
        "https://hydra.cc/docs/1.2/advanced/override_grammar/basic for details",
    ),
    # where the run cannot be written
    Case(
        "output directory under a file",
        ["hydra.run.dir={tmp}/a_file/run"],
        "cannot write the output directory {tmp}/a_file/run: Not a directory; choose another with "
        "hydra.run.dir=... (hydra.sweep.dir=... with -m)",
        files={"a_file": ""},
    ),
    # missing, empty or malformed data files
    Case(
        "missing data file",
        FILES,
        "data error: data.files.train: cannot read {tmp}/train.csv: no such file",
    ),
    Case(
        "empty data file",
        FILES,
        "data error: data.files.train: cannot read {tmp}/train.csv: EmptyDataError: No columns to parse from file",
        files={"train.csv": ""},
        fast=False,
    ),
    Case(
        "header only",
        FILES,
        "data error: the train split of {tmp}/train.csv is empty",
        files={"train.csv": "text,label\n"},
        fast=False,
    ),
    Case(
        "malformed json lines",
        ["data=files", "data.files.train={tmp}/train.jsonl", "data.n_classes=2"],
        "data error: data.files.train: cannot read {tmp}/train.jsonl: ArrowInvalid: JSON parse error",
        files={"train.jsonl": '{"text": "a", "label": 0}\n{"text": "b", "label"\n'},
        fast=False,
    ),
    Case(
        "missing label column",
        [*FILES, "data.label_column=sentiment"],
        "data error: column 'sentiment' (data.label_column) is not in {tmp}/train.csv (train); available columns: "
        "text, label",
        files={"train.csv": GOOD_CSV},
        fast=False,
    ),
    Case(
        "label outside the classes",
        FILES,
        "data error: label 7 in row 40 of the train split is outside the 2 declared classes (data.n_classes)",
        files={"train.csv": GOOD_CSV + "odd one,7\n"},
        fast=False,
    ),
    Case(
        "missing label",
        FILES,
        "data error: the train split of {tmp}/train.csv has no label in row 40 (column 'label')",
        files={"train.csv": GOOD_CSV + "no label here,\n"},
        fast=False,
    ),
    Case(
        "a directory given as the data file",
        FILES,
        "data error: data.files.train: {tmp}/train.csv is a directory: give a file",
        files={"train.csv/inside": ""},
    ),
    Case(
        "a single training row",
        FILES,
        "data error: the training split has 1 rows: too few to carve a validation split from",
        files={"train.csv": "text,label\nonly one,1\n"},
        fast=False,
    ),
    Case(
        "probe sentences on a generated task",
        ["callbacks.attention.sentences=[a dog]"],
        "invalid config: callbacks.attention.sentences=['a dog'] is invalid: expected [] for a task generated from "
        "token ids (headlab.data.recall.AssociativeRecall)",
    ),
    Case(
        "an overlong added key",
        ["+model." + "x" * 300 + "=1"],
        "invalid config: model." + "x" * 34 + "..." + "x" * 40 + " is 306 characters long: expected a key of at "
        "most 255",
    ),
    # checkpoints that do not fit
    Case(
        "resume from nothing",
        ["resume={tmp}/nothing"],
        "invalid config: resume='{tmp}/nothing' is invalid: expected a run directory of headlab-train (with "
        ".hydra/config.yaml or checkpoints/last.ckpt)",
    ),
    Case(
        "checkpoint from another model shape",
        ["resume={tmp}/other"],
        "invalid config: resume='{tmp}/other/checkpoints/last.ckpt' is invalid: expected a checkpoint of this "
        "model: model.tok_emb.weight is (139, 64) here, (24, 32) there",
        files={"other/checkpoints/last.ckpt": "other-shape"},
        run_dir="other",
        fast=False,
    ),
    Case(
        "checkpoint that would run code",
        ["resume={tmp}/unsafe"],
        "invalid config: resume='{tmp}/unsafe/checkpoints/last.ckpt' is invalid: expected a checkpoint loadable "
        "with weights_only=True, only tensors and plain types (WeightsUnpickler error: Unsupported global: "
        "GLOBAL pathlib.PosixPath",
        files={"unsafe/checkpoints/last.ckpt": "unsafe"},
        run_dir="unsafe",
        fast=False,
    ),
]
DATA_CONFIGS = sorted(p.stem for p in (ROOT / "conf" / "data").glob("[!_]*.yaml"))
DESIGNS = sorted(p.stem for p in (ROOT / "conf" / "design").glob("*.yaml"))
SUBPROCESS = {"model.attention.n_heads=0", "data=nope", "trainer=5", "missing data file"}  # one of each way to be
# refused early: headlab's checks, Hydra's, the command line's before Hydra composes, the data's


def _write(tmp: Path, name: str, content: str) -> None:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if content == "other-shape":  # a checkpoint of a model half as wide
        model = Encoder(vocab_size=24, n_classes=10, max_len=64, d_model=32, n_layers=1, readout="token")
        torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}, path)
    elif content == "unsafe":  # pickles an arbitrary object: loading it with weights_only=False would run code
        torch.save({"state_dict": {}, "payload": Path("/")}, path)
    else:
        path.write_text(content)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_with_one_line_and_no_success(tmp_path, monkeypatch, case):
    """Through the CLI's entry in this process (train_here); the next test runs some of the cases as real processes."""
    assert len(CASES) >= 30
    for name, content in case.files.items():
        _write(tmp_path, name, content)
    args = [a.format(tmp=tmp_path) for a in case.args]
    run_dir = ["hydra.run.dir=run"] if case.run_dir == "run" and "hydra.run.dir" not in " ".join(args) else []
    trained = []
    monkeypatch.setattr(pack_train, "train_run", lambda *a, **k: trained.append(1) or train_run(*a, **k))
    result = train_here("trainer.max_epochs=1", "logger=csv", *run_dir, *args, cwd=tmp_path)
    _check_refused(result, case, tmp_path)
    assert not trained if case.fast else trained  # fast: refused before training (and its imports) started


@pytest.mark.parametrize("case", [c for c in CASES if c.id in SUBPROCESS], ids=lambda c: c.id)
def test_the_real_process_refuses_fast_cases_before_importing_torch_or_scipy(tmp_path, case):
    for name, content in case.files.items():
        _write(tmp_path, name, content)
    args = [a.format(tmp=tmp_path) for a in case.args]
    overrides = ("trainer.max_epochs=1", "logger=csv", "hydra.run.dir=run", *args)
    result = headlab_train(*overrides, cwd=tmp_path, env={**cli_env(), "PYTHONPROFILEIMPORTTIME": "1"})
    imported = [
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    ]
    result.stderr = "\n".join(line for line in result.stderr.splitlines() if not line.startswith("import time:"))
    _check_refused(result, case, tmp_path)
    assert "headlab.cli.train" in imported and not {"torch", "lightning", "scipy"} & set(imported)


def _check_refused(result, case: Case, tmp_path: Path) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("headlab-train: "), result.stderr[-3000:]
    assert lines[0].removeprefix("headlab-train: ").startswith(case.message.format(tmp=tmp_path))
    assert "Traceback" not in result.stderr + result.stdout
    record = tmp_path / case.run_dir / "results.json"
    assert not record.exists() or json.loads(record.read_text())["status"] == "failed"


@pytest.mark.parametrize(
    "size, first",
    [("model.attention.latent_kv=50000000", "model.attention.latent_kv (50000000)"),
     ("model.d_ff=400000000", "model.d_ff (400000000)"), ("data.batch_size=2000000", "data.batch_size (2000000)")],
)  # fmt: skip
def test_a_model_too_large_for_memory_names_first_the_size_that_costs_most(run_cli, size, first):
    """Whatever size makes it too large (a latent's rank, the feed-forward width, the batch), the refusal names it
    first among what to lower: each size's cost is the memory its halving saves."""
    done = run_cli(size, "logger=csv", "hydra.run.dir=run")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"GiB are free: lower what costs most, {first}, " in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("data", ["pair_recall", "mqar", "listops"])
def test_every_shipped_data_config_composes_and_validates(data):
    with initialize_config_module("headlab.conf", version_base="1.3"):
        check_config(compose("train", overrides=[f"data={data}"]))


def _sections(node, prefix: str = "") -> list[str]:
    """Every key of a composed config (below hydra) whose value is keys of its own."""
    found = []
    for key in node:
        if isinstance(node._get_node(key), DictConfig) and f"{prefix}{key}" != "hydra":
            found += [f"{prefix}{key}", *_sections(node[key], f"{prefix}{key}.")]
    return found


def test_every_section_of_every_shipped_config_given_one_value_or_a_list_is_refused_by_its_name():
    """Whatever section a shipped config has (each data config's, each design's, each logger's), one value in its
    place fails the checks, and a list in its place fails as Hydra merges it, each in the line that names it."""
    groups = {"data": DATA_CONFIGS, "+design": DESIGNS, "logger": ["[csv,tensorboard,wandb]"]}
    choices = [f"{group}={option}" for group, options in groups.items() for option in options]
    with initialize_config_module("headlab.conf", version_base="1.3"):
        composed = {choice: compose("train", overrides=[choice]) for choice in choices}
        sections = {section: choice for choice, cfg in reversed(composed.items()) for section in _sections(cfg)}
        assert {"optim", "sweep.plan", "data.task", "data.files", "data.tokenizer", "model.attention.moh"} <= set(
            sections
        )
        for section, choice in sections.items():
            cfg = copy.deepcopy(composed[choice])
            OmegaConf.update(cfg, section, 5, merge=False)
            with pytest.raises(ConfigError) as refused:
                check_config(cfg)
            assert str(refused.value).startswith(f"{section}=5 is invalid: expected "), (choice, refused.value)
            if "." not in section and (ROOT / "conf" / section).is_dir():  # a group: [1,2] would name its configs
                said = refused_override([choice, f"{section}=[1,2]"])
                assert said.startswith(f"invalid config: {section}=1 is unknown"), (choice, said)
                continue
            with pytest.raises(ConfigCompositionException) as merged:
                compose("train", overrides=[choice, f"{section}=[1,2]"])
            said = one_line(merged.value)
            assert said.startswith(f"invalid config: {section}=[1,2] is invalid: expected "), (choice, said)


def _leaves(node, prefix: str = "") -> dict[str, object]:
    """Every key of a composed config (below hydra) that holds one value, with the value as shipped (unresolved)."""
    found = {}
    for key in node:
        child, name = node._get_node(key), f"{prefix}{key}"
        if isinstance(child, DictConfig):
            found |= _leaves(child, f"{name}.") if name != "hydra" else {}
        else:
            found[name] = child._value()
    return found


def test_every_true_false_or_number_key_shipped_given_a_word_is_refused_by_its_name():
    """Whatever key a shipped config holds true or false, or a number, in (each data config's, each design's, each
    logger's), a word in its place fails the checks, in the line that names it."""
    groups = {"data": DATA_CONFIGS, "+design": DESIGNS, "logger": ["[csv,tensorboard,wandb]"]}
    choices = [f"{group}={option}" for group, options in groups.items() for option in options]
    with initialize_config_module("headlab.conf", version_base="1.3"):
        composed = {choice: compose("train", overrides=[choice]) for choice in choices}
    keys = {key: (choice, v) for choice, cfg in reversed(composed.items()) for key, v in _leaves(cfg).items()}
    typed = {key: (choice, v) for key, (choice, v) in keys.items() if isinstance(v, bool | int | float)}
    assert {"tf32", "data.tokenizer.lowercase", "data.task.n_pairs", "optim.lr", "sweep.resume"} <= set(typed)
    for key, (choice, shipped) in typed.items():
        cfg = copy.deepcopy(composed[choice])
        OmegaConf.update(cfg, key, "maybe" if isinstance(shipped, bool) else "x", merge=False)
        with pytest.raises(ConfigError) as refused:
            check_config(cfg)
        assert str(refused.value).startswith(f"{key}="), (choice, key, refused.value)


def test_group_values_hydra_expands_itself_pass_the_command_line_check():
    """glob(...) names a group's configs by pattern, choice(...) lists them: refused_override leaves them to Hydra."""
    for given in ("data=glob(s*)", "+design=glob(*)", "trainer=choice(cpu,ddp_cpu)", "seed=range(3)", "logger=[]"):
        assert refused_override(["-m", given]) is None, given
    assert refused_override(["-m", "trainer=choice(cpu,5)"]).startswith("invalid config: trainer=5 is unknown")


def test_a_section_given_one_value_for_a_whole_sweep_is_refused_before_any_job(run_cli, tmp_path):
    done = run_cli("-m", "sweep=3", "seed=0,1", "hydra.sweep.dir=sweep")
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
    assert done.stderr.strip().splitlines()[-1] == (
        "headlab-train: invalid config: sweep=3 is invalid: expected keys of its own: set one of them as "
        "sweep.<key>=..."
    )
    assert not (tmp_path / "sweep").exists()


def test_a_pack_refuses_callbacks_it_would_never_call():
    message = (
        "callbacks.ema='EMAWeightAveraging' is invalid: expected null with hydra/launcher=packed (a pack of several "
        "runs headlab's own callbacks and early stopping only: the default launcher runs it)"
    )
    with initialize_config_module("headlab.conf", version_base="1.3"):
        cfg = compose("train", overrides=["+callbacks.ema._target_=lightning.pytorch.callbacks.EMAWeightAveraging"])
        plain = compose("train")
    with pytest.raises(ConfigError) as error:
        check_launch(cfg, in_sweep=True, launcher="packed")
    assert str(error.value).startswith(message)
    check_launch(cfg, in_sweep=True, launcher="basic")  # the default launcher runs any Lightning callback
    check_launch(plain, in_sweep=True, launcher="packed")  # and a pack runs the default ones itself
    with initialize_config_module("headlab.conf", version_base="1.3"):
        stopping = compose(
            "train", overrides=["callbacks=early_stopping", "+callbacks.es2=${callbacks.early_stopping}"]
        )
    check_launch(stopping, in_sweep=True, launcher="packed")  # and Lightning's early stopping, under any name


def test_checkpoints_as_an_older_headlab_recorded_them_still_pass():
    """An older headlab's model_checkpoint set save_last (before last_checkpoint wrote last.ckpt): such a run's
    config, read back by resume=, is its checkpoints as shipped."""
    with initialize_config_module("headlab.conf", version_base="1.3"):
        check_config(compose("train", overrides=["+callbacks.model_checkpoint.save_last=true"]))


def test_values_in_messages_are_written_as_an_override_writes_them():
    values = (None, True, False, 1, 0, 1.5, "cls")
    assert [as_written(v) for v in values] == ["null", "true", "false", "1", "0", "1.5", "'cls'"]


def test_a_misspelt_extension_key_is_refused_before_any_job(run_cli, tmp_path):
    done = run_cli("-m", "optim.lr=1e-3,3e-3", "sweep.extend.key=optim.lrr", "hydra.sweep.dir=sweep")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "headlab-train: invalid config: sweep.extend.key='optim.lrr' is invalid: expected a key the sweep varies: "
        "one of optim.lr"
    )
    assert not list((tmp_path / "sweep").glob("*/results.json"))


@pytest.mark.parametrize(
    "grid", ["model.attention.normalizer=softmax,sigmoid", "model.attention.normalizer=choice(softmax,sigmoid)"]
)
def test_an_extension_key_of_names_is_refused_before_any_job(run_cli, tmp_path, grid):
    """A grid of names has no value beyond its edge: refused, where it read "every arm's best is inside its grid"."""
    done = run_cli("-m", grid, "sweep.extend.key=model.attention.normalizer", "hydra.sweep.dir=sweep")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "headlab-train: invalid config: sweep.extend.key='model.attention.normalizer' is invalid: expected a key the "
        f"sweep varies over numbers (its grid is {grid.split('=', 1)[1]})"
    )
    assert not list((tmp_path / "sweep").glob("*/results.json"))


@pytest.mark.parametrize("storage", ["sqlite:///missing/folder/study.db", "bogus://study", "sqlite:///not_a_db"])
def test_a_study_storage_that_cannot_be_opened_is_one_line(run_cli, tmp_path, storage):
    pytest.importorskip("optuna")
    (tmp_path / "not_a_db").write_text("these bytes are no SQLite database")
    done = run_cli("-m", "hydra/sweeper=search", "hydra.sweeper.n_trials=1", f"hydra.sweeper.storage={storage}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("headlab-train: invalid config: hydra.sweeper.storage='")  # a file: its absolute path
    assert f"{storage.rsplit('/', 1)[-1]}' cannot be opened: " in last
