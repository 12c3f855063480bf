"""A function trainable whose trial runs a Ray Train ``DataParallelTrainer`` of ``num_workers`` workers.

Each worker fits a line ``y = w * x + b`` by gradient descent on its own shard of a synthetic data set (numpy only,
no framework, no gradient exchange: a stand-in for real data-parallel training) and reports every epoch; rank 0 also
reports a checkpoint. Tune's ``TuneReportCallback`` forwards rank 0's metrics to the trial and puts the Train
checkpoint's path in the metric ``checkpoint_path``. The Train run stores its checkpoints inside the trial's own folder,
so they are the experiment's, and airflow-tune hands the best one on as ``best_checkpoint_uri``.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

MODEL_FILE = "model.json"
#: The true line the workers recover.
TRUE_W, TRUE_B = 3.0, -1.0


def shard(rank: int, world: int, n: int = 512, seed: int = 0) -> tuple[Any, Any]:
    """This worker's slice of a fixed noisy data set on ``y = 3x - 1``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, n)
    y = TRUE_W * x + TRUE_B + rng.normal(0.0, 0.1, n)
    return x[rank::world], y[rank::world]


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Runs on each Train worker: ``epochs`` epochs of full-batch gradient descent, a report per epoch."""
    import numpy as np
    import ray.train

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    x, y = shard(rank, world)
    w = b = 0.0
    for epoch in range(int(config["epochs"])):
        for _ in range(int(config.get("steps_per_epoch", 20))):
            error = w * x + b - y
            w -= float(config["lr"]) * 2.0 * float(np.mean(error * x))
            b -= float(config["lr"]) * 2.0 * float(np.mean(error))
        loss = float(np.mean((w * x + b - y) ** 2))
        metrics = {"loss": loss, "epoch": epoch, "w": w, "b": b, "world_size": world}
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:  # one copy of the model: rank 0's
                with open(os.path.join(folder, MODEL_FILE), "w") as fh:
                    json.dump({"w": w, "b": b, "epoch": epoch, "lr": config["lr"]}, fh)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report(metrics, checkpoint=checkpoint)


def train_driver(config: dict[str, Any]) -> None:
    """The Tune trial: runs a Train run of ``num_workers`` workers with ``worker_cpus`` CPUs each, stored in the
    trial's own folder (``ray.tune.get_context().get_storage()``), and lets ``TuneReportCallback`` report to Tune."""
    import ray.train
    from ray import tune
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_storage = tune.get_context().get_storage()
    trainer = DataParallelTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=int(config["num_workers"]), resources_per_worker={"CPU": float(config["worker_cpus"])}
        ),
        run_config=ray.train.RunConfig(
            name="train",
            storage_path=trial_storage.trial_fs_path,
            storage_filesystem=trial_storage.storage_filesystem,
            # Train keeps the best checkpoints by the metric, so the trial's best is among them.
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=int(config.get("keep", 2)),
                checkpoint_score_attribute="loss",
                checkpoint_score_order="min",
            ),
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()
