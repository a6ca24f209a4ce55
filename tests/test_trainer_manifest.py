"""The manifest beside a checkpoint as a typed record: files written by older versions
(a dict dumped with `json`, these keys) load as they are, and writing one back leaves
the file as it was; a file that is not a manifest is refused, saying what it lacks."""

from __future__ import annotations

import json
import math

import msgspec
import pytest

from onjob.collector import Store
from onjob.deploy.act.runs import record as record_run
from onjob.trainer.manifest import FILE, Manifest, Precision, Sampler

# As `train()` wrote it before the manifest was a record (some of its keys, in its order),
# with a dropped step (its loss not finite: `json` writes NaN) and a group the logprob
# check skipped.
OLD = {
    "name": "ckpt-20261124-101500-a1b2c3",
    "parent": None,
    "base_model": "/models/tiny",
    "snapshot_sha256": "ab" * 32,
    "config_sha256": "cd" * 32,
    "config": {"lora_rank": 8, "learning_rate": 2e-05, "started_by": "loop"},
    "groups": ["g1", "g2"],
    "skipped_groups": {"g3": "its logprobs differ from the logged ones by 4.2"},
    "precision": {"device": "cpu", "head_dtype": "torch.float32", "sampler": {"dtype": "x"}},
    "metrics": {
        "steps": 1,
        "loss_last": -0.01,
        "duration_s": 12.5,
        "dropped_steps": [{"epoch": 0, "groups": ["g2"], "loss": math.nan, "grad_norm": 1.0}],
    },
    "history": [{"step": 1, "epoch": 0, "loss": -0.01, "lr": 2e-05}],
    "created": 1795000000.25,
}


def test_a_manifest_an_older_version_wrote_loads_and_is_written_back_unchanged(tmp_path):
    (tmp_path / FILE).write_text(json.dumps(OLD, indent=2))
    manifest = Manifest.read(tmp_path)
    assert manifest.name == OLD["name"] and manifest.parent is None
    assert (manifest.snapshot_sha256, manifest.config_sha256) == ("ab" * 32, "cd" * 32)
    assert manifest.groups == ["g1", "g2"] and "g3" in manifest.skipped_groups
    assert manifest.config["started_by"] == "loop"
    assert manifest.precision.sampler == Sampler(dtype="x")
    assert (manifest.steps, manifest.duration_s) == (1, 12.5)
    assert math.isnan(manifest.metrics.dropped_steps[0].loss)

    (tmp_path / "again").mkdir()
    manifest.write(tmp_path / "again")
    assert (tmp_path / "again" / FILE).read_text() == (tmp_path / FILE).read_text()


def test_a_manifest_from_before_the_logprob_check_loads_without_its_later_keys(tmp_path):
    """The first trainer wrote neither `skipped_groups` nor `precision`; its run records
    the groups it trained on."""
    first = {k: v for k, v in OLD.items() if k not in ("skipped_groups", "precision")}
    (tmp_path / FILE).write_text(json.dumps(first, indent=2))
    manifest = Manifest.read(tmp_path)
    assert (manifest.skipped_groups, manifest.precision) == ({}, Precision())

    store = Store(tmp_path / "onjob.duckdb")
    try:
        record_run(store, "run-1", manifest, tmp_path, None)
        run = store.dicts("SELECT groups_used, duration_s FROM train_runs")[0]
        checkpoint = store.dicts("SELECT name, base_model, status FROM checkpoints")[0]
    finally:
        store.close()
    assert run == {"groups_used": ["g1", "g2"], "duration_s": 12.5}
    assert checkpoint == {"name": OLD["name"], "base_model": "/models/tiny", "status": "candidate"}


def test_the_groups_a_run_skipped_are_recorded_as_used(tmp_path):
    (tmp_path / FILE).write_text(json.dumps(OLD, indent=2))
    store = Store(tmp_path / "onjob.duckdb")
    try:
        record_run(store, "run-1", Manifest.read(tmp_path), tmp_path, None)
        used = store.dicts("SELECT groups_used FROM train_runs")[0]["groups_used"]
    finally:
        store.close()
    assert used == ["g1", "g2", "g3"]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (json.dumps({k: v for k, v in OLD.items() if k != "groups"}), "`groups`"),
        (json.dumps({**OLD, "groups": "g1"}), "$.groups"),
        ("{not json", "Expecting property name"),
    ],
)
def test_a_file_that_is_not_a_manifest_is_refused_saying_what_is_wrong(tmp_path, content, said):
    (tmp_path / FILE).write_text(content)
    with pytest.raises(ValueError) as caught:
        Manifest.read(tmp_path)
    assert said in str(caught.value)
    assert isinstance(caught.value, msgspec.ValidationError | json.JSONDecodeError)
