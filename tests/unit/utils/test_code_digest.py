"""A by-value trainable's identity includes a digest of its code: two DAG files' ``train`` functions, or one edited
(itself or a helper it calls), are different trainables; the same code gives the same digest in every process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.utils.shipping import trainable_code
from tests.support.dag_files import (
    forget_dag_modules,  # noqa: F401  (autouse: the DAG-file modules leave after each test)
    load_dag_file,
)

SOURCE = """
CHOICES = {{"a", "b", "c", "d", "e"}}

def helper(x):
    return (x - 3) ** 2 + {offset}

def train(config):
    assert config.get("kind", "a") in {{"a", "b", "c"}}  # a set constant: pickled bytes depend on the hash seed
    return {{"loss": helper(config["x"])}}
"""


def _load(tmp_path: Path, folder: str, offset: int = 10, extra: str = ""):
    """A DAG file loaded as Airflow loads one, under a generated module name."""
    return load_dag_file(tmp_path, folder, SOURCE.format(offset=offset) + extra)


def test_the_same_code_gives_the_same_digest_and_other_code_another(tmp_path):
    one = trainable_code(_load(tmp_path, "a").train)
    same_elsewhere = trainable_code(_load(tmp_path, "b").train)
    helper_edited = trainable_code(_load(tmp_path, "c", offset=11).train)
    unrelated_edit = trainable_code(_load(tmp_path, "d", extra="\nSCHEDULE = '@daily'\n").train)
    assert one.by_value and one.digest and one.digest.startswith("sha256:")
    assert one.import_path == helper_edited.import_path  # the same shipped name ...
    assert one.digest != helper_edited.digest  # ... but another trainable
    assert one.digest == same_elsewhere.digest  # the same code is the same trainable
    assert one.digest == unrelated_edit.digest  # an edit elsewhere in the DAG file is not


def test_the_digest_is_the_same_in_every_try_whatever_the_hash_seed(tmp_path):
    _load(tmp_path, "a")
    dag_file = str(tmp_path / "a" / "my_dag.py")
    script = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('unusual_prefix_a_my_dag', {dag_file!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m)\n"
        "from airflow_tune.utils.shipping import trainable_code\n"
        "print(trainable_code(m.train).digest)\n"
    )
    digests = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        digests.add(out.stdout.strip().splitlines()[-1])
    assert len(digests) == 1, digests


def test_the_digest_is_part_of_the_experiments_identity(tmp_path):
    base = {"trainable": "airflow_tune_shipped:train", "name": "e", "storage_path": "s3://bkt/x", "metric": "loss"}
    one = ExperimentSpec.from_dict({**base, "mode": "min", "trainable_digest": "sha256:" + "a" * 64})
    other = ExperimentSpec.from_dict({**base, "mode": "min", "trainable_digest": "sha256:" + "b" * 64})
    by_path = ExperimentSpec.from_dict({**base, "mode": "min"})
    assert one.fingerprint() != other.fingerprint() != by_path.fingerprint()
