"""Read back what an offline W&B run wrote (the .wandb file is a LevelDB-style log of protobuf records)."""

import glob
import json
import os
import struct

from wandb.proto import wandb_internal_pb2


def _records(path):
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, block, buffer = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        buffer += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buffer)
            buffer = b""
            yield record


def run_files(wandb_dir):
    return sorted(glob.glob(os.path.join(wandb_dir, "wandb", "*run-*", "run-*.wandb")))


def history(path):
    """Each logged row as {key: value}."""
    rows = []
    for record in _records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return rows


def run_id(path):
    return os.path.basename(path)[len("run-") : -len(".wandb")]
