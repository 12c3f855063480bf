"""A trial's output, files and names as spec fields and operator arguments, and the task log's view of the output
(read from files in a local folder standing for storage; what reaches S3 is tests/integration/test_trial_output.py
and tests/e2e/test_trial_output.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from airflow_tune.common.spec import ExperimentSpec, SpecError, code_references
from airflow_tune.common.spec.trial_output import log_files
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.utils import trial_logs
from airflow_tune.utils.shipping import SHIPPED_PACKAGE
from tests.unit.trust.test_security import _run_until_submit

pytestmark = pytest.mark.unit

BASE = {"trainable": "pkg.mod:train", "name": "e", "storage_path": "s3://bkt/p", "metric": "loss", "mode": "min"}


def test_the_defaults_put_output_in_files_and_leave_artifacts_and_names_to_tune():
    spec = ExperimentSpec.from_dict(BASE)
    assert spec.log_to_file is True and spec.sync_artifacts is False
    assert spec.trial_name_creator is None and spec.trial_dirname_creator is None
    assert log_files(spec.log_to_file) == ("stdout", "stderr")


@pytest.mark.parametrize(
    ("value", "files"),
    [(True, ("stdout", "stderr")), (False, None), ("all.log", ("all.log", "all.log")), (("o", "e"), ("o", "e"))],
)
def test_tunes_forms_of_log_to_file(value, files):
    spec = ExperimentSpec.from_dict({**BASE, "log_to_file": value})
    assert log_files(spec.log_to_file) == files


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("log_to_file", "../out", "not a plain file name"),
        ("log_to_file", "result.json", "not a plain file name"),
        ("log_to_file", ["a", "b", "c"], "a [stdout, stderr] pair"),
        ("log_to_file", 3, "a [stdout, stderr] pair"),
        ("sync_artifacts", "yes", "must be true or false"),
        ("trial_name_creator", "not a path", "not an import path"),
        ("trial_dirname_creator", 7, "not an import path"),
    ],
)
def test_bad_values_are_refused_naming_the_field_and_the_fix(field, value, said):
    with pytest.raises(SpecError) as raised:
        ExperimentSpec.from_dict({**BASE, field: value})
    [item] = [i for i in raised.value.errors if i.startswith(f"{field} = ")]
    assert said in item and "; " in item, item


def test_the_creators_are_code_references():
    spec = ExperimentSpec.from_dict({**BASE, "trial_name_creator": "a.b:n", "trial_dirname_creator": "a.b:d"})
    assert ("trial_name_creator", "a.b:n") in code_references(spec)
    assert ("trial_dirname_creator", "a.b:d") in code_references(spec)


def _namer(trial: Any) -> str:
    return "t"


def test_a_creator_written_in_the_dag_file_is_accepted_as_a_path_or_shipped_as_a_function():
    op = _run_until_submit({}, trial_name_creator="pkg.names:name", trial_dirname_creator=lambda trial: "d")
    assert op.submitted_spec.trial_name_creator == "pkg.names:name"
    assert op.submitted_spec.trial_dirname_creator == f"{SHIPPED_PACKAGE}:trial_dirname_creator"
    assert op.creator_codes["trial_dirname_creator"].by_value


@pytest.mark.parametrize("value", [3, "{{ params.namer }}", {"factory": "a.b:c"}])
def test_a_creator_that_is_not_a_function_or_an_import_path_is_refused(value):
    with pytest.raises(TypeError, match="trial_name_creator = .*give a function"):
        RayTuneOperator(
            task_id="t", trainable="a.b:c", storage_path="s3://bkt/p", metric="m", mode="min", trial_name_creator=value
        )


def test_a_creator_mapped_from_an_xcom_is_data():
    from airflow.sdk import DAG, task

    from airflow_tune.trust.code import arguments_mapped_from_data

    with DAG("mapped_creators", schedule=None) as dag:

        @task
        def chosen() -> list[str]:
            return ["pkg.mod:name"]

        common = {"trainable": "a.b:c", "storage_path": "s3://bkt/p", "metric": "m", "mode": "min"}
        RayTuneOperator.partial(task_id="tune", **common).expand(trial_name_creator=chosen())
    assert arguments_mapped_from_data(dag.task_dict["tune"], ["trial_name_creator"]) == {"trial_name_creator"}


def test_trial_logs_is_one_of_three_choices():
    with pytest.raises(ValueError, match="trial_logs = 'some': .*'errored'"):
        RayTuneOperator(
            task_id="t", trainable="a.b:c", storage_path="s3://bkt/p", metric="m", mode="min", trial_logs="some"
        )


# -- the task log's view ------------------------------------------------------------------------------------------
def _experiment(tmp_path, rows: list[dict[str, Any]]) -> str:
    from airflow_tune.common import storage
    from airflow_tune.common.contract import RESULT_FILE, manifest_uri

    uri = f"file://{tmp_path}/exp"
    storage.write_json(manifest_uri(uri, RESULT_FILE), {"trials": rows})
    return uri


def _trial(tmp_path, name: str, text: str, error: str | None = None) -> dict[str, Any]:
    folder = tmp_path / "exp" / name
    folder.mkdir(parents=True)
    (folder / "stdout").write_text(text)
    (folder / "stderr").write_text(f"err of {name}\n")
    return {"trial_id": name, "status": "ERROR" if error else "TERMINATED", "error": error, "path": str(folder)}


def test_the_task_log_shows_the_errored_trials_last_lines_only(tmp_path, caplog):
    long = "".join(f"line {i}\n" for i in range(1000))
    rows = [_trial(tmp_path, "ok", "fine\n"), _trial(tmp_path, "bad", long + "\x1b[31mred\x1b[0m\x07\n", "boom")]
    uri = _experiment(tmp_path, rows)
    caplog.set_level(logging.INFO)
    trial_logs.log_trial_output(uri, True, "errored", logging.getLogger("t"))
    text = caplog.text
    assert "fine" not in text and "err of ok" not in text
    assert "Trial bad (ERROR), last lines of stdout" in text and "err of bad" in text
    assert f"line {999}" in text and "line 900\n" not in text  # the last lines only
    assert "\x1b" not in text and "\x07" not in text and "?red??" in text, repr(text[-600:])


def test_all_shows_every_listed_trial_errored_first_and_a_cap(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(trial_logs, "MAX_TRIALS", 2)
    rows = [_trial(tmp_path, f"t{i}", f"out {i}\n") for i in range(3)] + [_trial(tmp_path, "bad", "x\n", "boom")]
    uri = _experiment(tmp_path, rows)
    caplog.set_level(logging.INFO)
    trial_logs.log_trial_output(uri, ["stdout", None], "all", logging.getLogger("t"))
    shown = [r.getMessage().split(",")[0] for r in caplog.records if r.getMessage().startswith("Trial ")]
    assert shown == ["Trial bad (ERROR)", "Trial t0 (TERMINATED)"]
    assert "Output of 2 more trials not shown" in caplog.text


def test_nothing_outside_the_experiment_is_read_and_none_reads_nothing(tmp_path, caplog):
    secret = tmp_path / "elsewhere"
    secret.mkdir()
    (secret / "stdout").write_text("not the trial's\n")
    uri = _experiment(tmp_path, [{"trial_id": "x", "error": "e", "path": f"{secret}/../elsewhere"}])
    caplog.set_level(logging.INFO)
    trial_logs.log_trial_output(uri, True, "errored", logging.getLogger("t"))
    trial_logs.log_trial_output(uri, True, "none", logging.getLogger("t"))
    assert "not the trial's" not in caplog.text
    # A row naming a folder elsewhere is read as the folder of that name inside this experiment: none there.
    assert (
        "no stdout output (nothing printed, or no file in" in caplog.text and f"{tmp_path}/exp/elsewhere" in caplog.text
    )
