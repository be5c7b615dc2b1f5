"""An offline W&B run read back from its run-<id>.wandb file, without W&B's servers: what headlab-sync shows before
it uploads (headlab-sync --show), and what the tests check a run logged.

Offline runs write no wandb-summary.json; what was logged lives only in this file, a LevelDB-style log of protobuf
records: a 7-byte file header (":W&B", magic 0xBEE1, version), then 32 KiB blocks of chunks, each with a 7-byte
header (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last).
"""

import json
import struct
import time
from pathlib import Path

from headlab.errors import first_line
from headlab.escape import terminal
from headlab.files import check_received

BLOCK = 32768
HEADER = 7
MAX_LOG_BYTES = 2**30  # a run's log is KB to MB (attention maps included): a larger one is not read


def records(path: Path):
    """The protobuf records of a run-<id>.wandb file, in the order they were written: a plain file of at most
    MAX_LOG_BYTES (check_received: never a pipe, a link or a device), else NotARecord."""
    from wandb.proto import wandb_internal_pb2

    data = check_received(path, MAX_LOG_BYTES).read_bytes()
    if len(data) < HEADER or struct.unpack("<4sHB", data[:HEADER])[:2] != (b":W&B", 0xBEE1):
        raise ValueError(f"{path} is not a W&B run log")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # too little room left in this block for a chunk header
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if pos + HEADER + length > len(data):  # a chunk W&B is still writing: the file so far
            break
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def read_run(run_dir: Path, wait_s: float = 60.0) -> dict:
    """A finished run directory's offline W&B run (its wandb/offline-run-*/run-*.wandb; see read_log). W&B's own
    process may still be writing the file when the run has ended (its last records come after wandb.finish
    returns): read again until it holds W&B's exit record, for at most wait_s seconds."""
    (path,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + wait_s
    while True:
        run = read_log(path)
        if run["exited"] or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def read_log(path: Path) -> dict:
    """One offline run: {'run': its last Record.run (name, group, tags), 'config': {key: value}, 'history':
    [{key: value}], 'summary': {key: value}, 'exited': whether W&B wrote its exit record (the file is complete)},
    the summary as W&B's API returns it (media as nested dicts)."""
    out = {"run": None, "config": {}, "history": [], "summary": {}, "exited": False}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
        elif kind == "config":
            for item in record.config.update:
                out["config"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            )
        elif kind == "exit":
            out["exited"] = True
        elif kind == "summary":
            for item in record.summary.update:
                keys = [item.key] if item.key else list(item.nested_key)
                node = out["summary"]
                for key in keys[:-1]:
                    node = node.setdefault(key, {})
                node[keys[-1]] = json.loads(item.value_json)
    return out


SHOWN = ("val/acc_best", "test/acc", "test/loss")  # the summary numbers a line shows


def describe(folder: Path) -> str:
    """One line on an offline run folder (wandb/offline-run-*): its name and group, what it logged, its final
    numbers; or why it cannot be read. Every text from the run is escaped for a terminal."""
    logs = list(folder.glob("run-*.wandb"))
    if len(logs) != 1:
        return terminal(f"{folder}: cannot be read (no run-*.wandb, or several)")
    try:
        run = read_log(logs[0])
    except Exception as error:  # not a plain file, not W&B's format, a record cut short or corrupt
        return terminal(f"{folder}: cannot be read ({first_line(error)})")
    name = run["run"].display_name if run["run"] else "?"
    group = f" (group {run['run'].run_group})" if run["run"] and run["run"].run_group else ""
    numbers = ", ".join(f"{k} {run['summary'][k]:.4f}" for k in SHOWN if isinstance(run["summary"].get(k), float))
    return terminal(
        f"{folder}: {name}{group}: {len(run['config'])} config keys, {len(run['history'])} logged steps"
    ) + (f"; {numbers}" if numbers else "")
