"""Checkpoint metadata, integrity and atomic publication (no trainer logic here).

A checkpoint folder `checkpoint-K` (K completed epochs) or `checkpoint-step-N` (N optimizer steps) holds
the Trainer's files (`agent_i/`, `optimizer.pt`, `scheduler.pt`, `rng_state.pth`, `trainer_state.json`)
and `comlrl_state.json`, written last: the run's metadata plus a sha256 manifest of every other file.
A folder is published by renaming a fully written, fsynced temporary folder, so a crash leaves either
the complete checkpoint or nothing under its name.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from typing import Any

logger = logging.getLogger(__name__)
STATE_NAME = "comlrl_state.json"
FORMAT_VERSION = 1
METADATA_SHA_KEY = "metadata_sha256"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(step-)?(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete, corrupt, or incompatible with the trainer resuming it."""


def read_checkpoint_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The metadata of a checkpoint folder (or of its `comlrl_state.json`).

    Returns at least `{"wandb": None | {"id", "project", "entity"}, "trainer_class", "boundary", "kind",
    "global_step", "env_step", "run_id"}`. Reading it loads no weights.
    """
    path = os.fspath(path)
    file = path if path.endswith(".json") else os.path.join(path, STATE_NAME)
    if not os.path.isfile(file):
        raise CheckpointError(f"{path} is not a comlrl_hf checkpoint: {STATE_NAME} is missing")
    try:
        with open(file, encoding="utf-8") as f:
            metadata = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{file} is unreadable or truncated: {error}") from error
    if not isinstance(metadata, dict) or metadata.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{file} has an unknown format (format_version {metadata.get('format_version')!r})"
                              if isinstance(metadata, dict) else f"{file} does not hold a JSON object")
    recorded = metadata.pop(METADATA_SHA_KEY, None)
    if recorded is None:
        raise CheckpointError(f"{file} has no {METADATA_SHA_KEY}; its metadata cannot be verified")
    if recorded != metadata_sha256(metadata):
        raise CheckpointError(f"{file} was modified after it was written: its content does not match its {METADATA_SHA_KEY}")
    metadata.setdefault("wandb", None)
    return metadata


def metadata_sha256(metadata: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of `metadata` (without its own checksum). The file manifest covers every
    other file of a checkpoint; this covers the metadata file, so a hand-edited or damaged one is refused."""
    payload = {k: v for k, v in metadata.items() if k != METADATA_SHA_KEY}
    payload = json.loads(json.dumps(payload))  # as read back from the file (e.g. int keys become strings)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def seal_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """`metadata` plus its checksum, ready for `write_json` as `comlrl_state.json`."""
    return {**metadata, METADATA_SHA_KEY: metadata_sha256(metadata)}


def checkpoint_name(kind: str, count: int) -> str:
    return f"checkpoint-{count}" if kind == "epoch" else f"checkpoint-step-{count}"


def list_checkpoints(directory: str | os.PathLike) -> list[str]:
    """Published checkpoints in `directory` (temporary and partial folders never match), oldest first by
    the optimizer step they were taken at."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if _CHECKPOINT_RE.match(name) and os.path.isfile(os.path.join(path, STATE_NAME)):
            try:
                metadata = read_checkpoint_metadata(path)
                # stages of preference trainers share a global_step; their boundary count orders them
                found.append((metadata["global_step"], int(metadata.get("boundary") or 0), name, path))
            except (CheckpointError, KeyError) as error:
                logger.warning("skipping %s: its metadata is unreadable (%s)", path, error)
    return [path for *_, path in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> str | None:
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1] if checkpoints else None


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_manifest(directory: str) -> dict[str, str]:
    """sha256 of every file below `directory` except the metadata file, by relative path."""
    manifest = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            if rel != STATE_NAME:
                manifest[rel.replace(os.sep, "/")] = _sha256(path)
    return dict(sorted(manifest.items()))


def verify_manifest(directory: str, manifest: dict[str, str]) -> None:
    """Raise `CheckpointError` naming the first missing or altered file of the manifest."""
    for rel, expected in manifest.items():
        path = os.path.join(directory, *rel.split("/"))
        if not os.path.isfile(path):
            raise CheckpointError(f"checkpoint {directory} is incomplete: {rel} is missing")
        if _sha256(path) != expected:
            raise CheckpointError(f"checkpoint {directory} is corrupt: {rel} does not match its recorded sha256")


def fsync_tree(directory: str) -> None:
    for root, dirs, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staging_dir(parent: str, name: str) -> str:
    """A fresh temporary folder beside the final one (same file system, so the rename is atomic)."""
    os.makedirs(parent, exist_ok=True)
    path = os.path.join(parent, f".tmp-{name}-{uuid.uuid4().hex[:8]}")
    os.makedirs(path)
    return path


def publish(staging: str, final: str) -> None:
    """Atomically make `staging` visible as `final` (replacing an older folder of that name)."""
    fsync_tree(staging)
    parent = os.path.dirname(final)
    old = None
    if os.path.exists(final):
        old = os.path.join(parent, f".old-{os.path.basename(final)}-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
    os.replace(staging, final)
    _fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def retire(path: str) -> None:
    """Remove a checkpoint: renamed out of the checkpoint namespace first, so a crash mid-delete never leaves
    a partial folder under a checkpoint name."""
    doomed = os.path.join(os.path.dirname(path), f".del-{os.path.basename(path)}-{uuid.uuid4().hex[:8]}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_stale_staging(directory: str) -> None:
    """Clear what a crash mid-write left: temporary and half-deleted folders go; a replaced checkpoint whose
    successor never got its name (a crash between the two renames of `publish`) is put back."""
    if not os.path.isdir(directory):
        return
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith(".old-checkpoint-"):
            original = os.path.join(directory, name[len(".old-"):].rsplit("-", 1)[0])
            if not os.path.exists(original):
                os.replace(path, original)
                continue
        if name.startswith((".tmp-checkpoint-", ".old-checkpoint-", ".del-checkpoint-")):
            shutil.rmtree(path, ignore_errors=True)


def write_json(path: str, payload: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def write_failure_message(name: str, parent: str, staging: str | None, error: BaseException) -> str:
    """The message of the `CheckpointError` raised when writing checkpoint `name` into `parent` failed.

    A full disk reaches us as `OSError(ENOSPC)` from Python writes, but as `SafetensorError` ("I/O error: No space
    left on device") from safetensors and as a `RuntimeError` ("unexpected pos ...") from `torch.save`, so the
    message gives the errno when there is one, the original error, and the free space left on that file system."""
    code = getattr(error, "errno", None)
    cause = f"{type(error).__name__}: {error}"
    if code is not None and errno.errorcode.get(code) and errno.errorcode[code] not in cause:
        cause = f"{errno.errorcode[code]}, {cause}"
    try:
        free = shutil.disk_usage(parent).free
        free = f"{free} bytes free on its file system" + (": the disk looks full" if free < 64 << 20 else "")
    except OSError:
        free = "free space unknown"
    where = f"the partial folder {staging} was removed" if staging else "no folder was created"
    return (f"could not write checkpoint {os.path.join(parent, name)} ({cause}; {free}); {where}, "
            "and the checkpoints published before it are untouched")
