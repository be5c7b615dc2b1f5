"""Read an offline W&B run back from its run-<id>.wandb file (a LevelDB-style log of protobuf records).

Offline runs write no wandb-summary.json; what was logged lives only in this file. Format: a 7-byte file
header (":W&B", magic 0xBEE1, version), then 32 KiB blocks of chunks, each with a 7-byte header
(crc32c, length, type: 1 full, 2 first, 3 middle, 4 last).
"""

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = 7


def records(path: Path):
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B" and magic == 0xBEE1
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # too little room left in this block for a chunk header
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
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


def read_run(run_dir: Path) -> dict:
    """One offline run: {'run': its last Record.run (name, group, tags), 'config': {key: value}, 'history':
    [{key: value}], 'summary': {key: value}}, the summary as W&B's API returns it (media as nested dicts)."""
    (path,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    out = {"run": None, "config": {}, "history": [], "summary": {}}
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
        elif kind == "summary":
            for item in record.summary.update:
                keys = [item.key] if item.key else list(item.nested_key)
                node = out["summary"]
                for key in keys[:-1]:
                    node = node.setdefault(key, {})
                node[keys[-1]] = json.loads(item.value_json)
    return out
