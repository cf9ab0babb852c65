"""Trackers: TensorBoard events read back with TensorBoard's reader, MLflow's file store, W&B offline."""

from __future__ import annotations

import json
import struct

import pytest

import fedge
from fedge.tracking import scalars
from fedge.tracking.tensorboard_sink import TensorBoardSink, crc32c


def test_crc32c_known_value():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_scalars_flatten_links_and_nodes():
    row = {
        "round": 3,
        "accuracy": 0.5,
        "bits_by_link": {"up": {"model_up": 8}},
        "storage_by_node": {"client:0": 4},
    }
    assert scalars(row) == {"accuracy": 0.5, "bits_by_link/up/model_up": 8.0, "storage_by_node/client_0": 4.0}


def read_tensorboard(folder):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(folder), size_guidance={accumulator.SCALARS: 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_events_read_back(tiny_config):
    tiny_config.update(tracking=["tensorboard"], eval={"every": 2})
    result = fedge.run(tiny_config)
    scalars_ = read_tensorboard(result.run_dir / "tensorboard")
    rows = result.metrics
    assert [step for step, _ in scalars_["accuracy"]] == [2, 4]
    assert [v for _, v in scalars_["accuracy"]] == pytest.approx(
        [r["accuracy"] for r in rows[1::2]], rel=1e-6
    )
    assert [step for step, _ in scalars_["train_loss"]] == [1, 2, 3, 4]
    up = scalars_["bits_by_link/up/model_up"]
    assert [v for _, v in up] == pytest.approx([r["bits_by_link"]["up"]["model_up"] for r in rows], rel=1e-6)
    assert "storage_by_node/client_0" in scalars_ and "mb_total" in scalars_


def test_tensorboard_resume_replaces_rounds_after_the_checkpoint(tmp_path):
    first = TensorBoardSink(tmp_path, start=0)
    for step in (1, 2, 3):
        first.log(step, {"x": float(step)})
    first.close()
    resumed = TensorBoardSink(tmp_path, start=1)  # checkpoint at round 1: rounds 2, 3 are redone
    for step in (2, 3):
        resumed.log(step, {"x": 10.0 * step})
    resumed.close()
    assert read_tensorboard(tmp_path)["x"] == [(1, 1.0), (2, 20.0), (3, 30.0)]


def test_mlflow_file_store(tiny_config, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    tiny_config["tracking"] = [{"name": "mlflow", "uri": uri, "project": "tests"}]
    result = fedge.run(tiny_config)
    run_id = json.loads((result.run_dir / "tracking.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(run_id, "accuracy")
    assert sorted((m.step, m.value) for m in history) == [(r["round"], r["accuracy"]) for r in result.metrics]
    run = client.get_run(run_id)
    assert run.data.params["algorithm.name"] == "fedavg" and run.info.status == "FINISHED"
    assert run.data.metrics["summary/final_accuracy"] == result.summary["final_accuracy"]


def wandb_records(path):
    """The protobuf records of a W&B ``.wandb`` file (a LevelDB-style log after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, chunk, block = path.read_bytes(), 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            yield record
            chunk = b""


def test_wandb_offline(tiny_config, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tiny_config["tracking"] = [{"name": "wandb", "mode": "offline", "project": "tests"}]
    result = fedge.run(tiny_config)
    wandb.teardown()  # the W&B service writes the run file in the background; wait until it has
    (log,) = result.run_dir.glob("wandb/offline-run-*/run-*.wandb")
    steps = {}
    for record in wandb_records(log):
        if record.WhichOneof("record_type") == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            steps[items["_step"]] = items
    assert sorted(steps) == [1, 2, 3, 4]
    assert [steps[r["round"]]["accuracy"] for r in result.metrics] == [r["accuracy"] for r in result.metrics]
    assert steps[4]["bits_by_link/up/model_up"] == result.metrics[-1]["bits_by_link"]["up"]["model_up"]
