"""The checkpoint registry: adapters as `checkpoints` rows plus PEFT directories.

Statuses: `candidate` (trained or imported, serving nothing), `canary` (serving a
slice of an alias's traffic), `review` (a canary that won its pairs, waiting for a
person: `reviews.py`), `live`, `retired`, `stranded` (retired, but an engine refused to
unload it: the operator tries again, after a restart too). An adapter trained elsewhere is
imported after checking it fits the base model: its LoRA matrices' shapes must
match the base model's layers (read from the safetensors header and the base
`config.json`, so no torch is needed on the proxy host).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import get_args

from ...collector import Store
from ..errors import RegistryError
from ..records import CHECKPOINT_COLUMNS, Checkpoint, Status

STATUSES: tuple[Status, ...] = get_args(Status)
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def checkpoints(store: Store) -> list[Checkpoint]:
    return store.rows(Checkpoint, f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints ORDER BY created")


def get(store: Store, name: str) -> Checkpoint | None:
    rows = store.rows(
        Checkpoint, f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE name = ?", [name]
    )
    return rows[0] if rows else None


def set_status(
    store: Store, name: str, status: Status, *, only_from: tuple[Status, ...] = ()
) -> None:
    """The one writer of a checkpoint's status (in the caller's transaction, if any); with
    `only_from`, only a checkpoint in one of those statuses changes."""
    if status not in STATUSES:
        raise RegistryError(f"unknown status {status!r} (one of {', '.join(STATUSES)})")
    sql, params = "UPDATE checkpoints SET status = ? WHERE name = ?", [status, name]
    if only_from:
        sql += " AND list_contains(?::VARCHAR[], status)"
        params.append(list(only_from))
    store.con.execute(sql, params)


def add(store: Store, path: Path, name: str, base_model: Path) -> Checkpoint:
    """Import an adapter directory as a `candidate` after validating it against the base."""
    if not _NAME.match(name):
        raise RegistryError(
            f"{name!r} is not a usable checkpoint name (letters, digits, '.', '_', '-')"
        )
    if get(store, name) is not None:
        raise RegistryError(f"a checkpoint named {name!r} exists already")
    validate(path, base_model)
    insert(store, name, parent=None, base_model=str(base_model), path=path, train_run=None)
    return get(store, name)


def insert(
    store: Store,
    name: str,
    *,
    parent: str | None,
    base_model: str,
    path: Path,
    train_run: str | None,
) -> None:
    """The one writer of a `checkpoints` row (in the caller's transaction, if any): a new
    `candidate`, trained by `train_run` (`runs.record`) or imported (`add`: none)."""
    store.execute(
        "INSERT INTO checkpoints (name, parent, base_model, path, created, train_run, status) "
        "VALUES (?, ?, ?, ?, now(), ?, 'candidate')",
        [name, parent, base_model, str(path.resolve()), train_run],
    )


def path_of(store: Store, name: str) -> Path | None:
    """Where checkpoint `name`'s adapter directory is (None: no such checkpoint)."""
    row = get(store, name)
    return Path(row.path) if row is not None else None


def validate(path: Path, base_model: Path) -> None:
    """Raise `RegistryError` saying what does not fit."""
    config_file, weights = path / "adapter_config.json", path / "adapter_model.safetensors"
    for needed in (config_file, weights):
        if not needed.is_file():
            raise RegistryError(f"{path} is not a PEFT adapter directory: {needed.name} missing")
    config = json.loads(config_file.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise RegistryError(f"{path}: a {config.get('peft_type')} adapter, not LoRA")
    if config.get("r") not in VLLM_RANKS:
        raise RegistryError(f"{path}: rank {config.get('r')} is not one vLLM serves {VLLM_RANKS}")
    base = json.loads((base_model / "config.json").read_text())
    expected = _in_features(base)
    layers = base.get("num_hidden_layers")
    for key, shape in _shapes(weights).items():
        found = re.search(r"layers\.(\d+)\.(?:\w+\.)?(\w+)\.lora_A\.", key)
        if not found:
            continue
        layer, module = int(found.group(1)), found.group(2)
        if layers is not None and layer >= layers:
            raise RegistryError(f"{path}: {key} is for layer {layer}; the base has {layers}")
        want = expected.get(module)
        if want is not None and shape[-1] != want:
            raise RegistryError(
                f"{path}: {key} takes {shape[-1]} inputs; the base model's {module} takes {want}"
                " (trained for another base model?)"
            )


def _in_features(config: dict) -> Mapping[str, int]:
    hidden = config["hidden_size"]
    heads = config.get("num_attention_heads", 1)
    head_dim = config.get("head_dim") or hidden // heads
    return {
        "q_proj": hidden,
        "k_proj": hidden,
        "v_proj": hidden,
        "o_proj": heads * head_dim,
        "gate_proj": hidden,
        "up_proj": hidden,
        "down_proj": config.get("intermediate_size", hidden),
    }


def _shapes(weights: Path) -> Mapping[str, list[int]]:
    """Tensor shapes from a safetensors header (8-byte little-endian length, then JSON)."""
    with weights.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
