"""Importing adapters trained elsewhere into the registry, checked against the base model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from onjob.collector import Store
from onjob.deploy.act import registry

from .conftest import rows

ONJOB = str(Path(sys.executable).with_name("onjob"))


def test_an_adapter_for_the_base_model_is_imported_as_a_candidate(
    tmp_path, tiny_adapter_dir, tiny_model_dir
):
    db = tmp_path / "onjob.duckdb"
    add = [ONJOB, "checkpoints", "add", str(tiny_adapter_dir), "--name", "from-elsewhere"]
    done = subprocess.run(
        [*add, "--db", str(db), "--base-model", str(tiny_model_dir)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    [row] = rows(db, "SELECT * FROM checkpoints")
    assert row["name"] == "from-elsewhere" and row["status"] == "candidate"
    assert row["path"] == str(tiny_adapter_dir.resolve()) and row["train_run"] is None
    listed = subprocess.run([ONJOB, "checkpoints", "--db", str(db)], capture_output=True, text=True)
    assert "from-elsewhere" in listed.stdout and "candidate" in listed.stdout
    again = subprocess.run(
        [*add, "--db", str(db), "--base-model", str(tiny_model_dir)], capture_output=True, text=True
    )
    assert again.returncode == 2 and "exists already" in again.stderr


def test_an_adapter_for_another_base_model_is_refused_with_the_reason(
    tmp_path, tiny_adapter_dir, bundled_dir
):
    store = Store(tmp_path / "onjob.duckdb")
    try:
        with pytest.raises(registry.RegistryError, match="trained for another base model"):
            registry.add(store, tiny_adapter_dir, "wrong-base", bundled_dir)
        with pytest.raises(registry.RegistryError, match=r"adapter_config\.json missing"):
            registry.add(store, tmp_path, "empty", bundled_dir)
        with pytest.raises(registry.RegistryError, match="not a usable checkpoint name"):
            registry.add(store, tiny_adapter_dir, "../etc", bundled_dir)
        assert registry.checkpoints(store) == []
    finally:
        store.close()
