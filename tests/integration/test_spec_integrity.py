"""The driver runs only the spec the operator submitted: a spec changed in storage between submission and the driver's
start is refused (its digest travels in the entrypoint, where no storage writer can change it), on a real Ray head
with the spec in the real S3 endpoint."""

from __future__ import annotations

import shlex

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import (
    ENGINE_ENTRYPOINT,
    JOB_ID_ENV,
    digest_of,
    engine_command,
    job_spec_uri,
    spec_file_bytes,
)
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(240)


def _submit(stack, spec: dict, entrypoint: str) -> str:
    job_id = f"{spec['name']}-1"
    jobs.client(stack).submit_job(
        entrypoint=entrypoint,
        submission_id=job_id,
        runtime_env={"py_modules": [jobs.PACKAGE, jobs.TESTKIT], "env_vars": {JOB_ID_ENV: job_id}},
    )
    return job_id


def _spec(stack, name: str, marker_dir: str) -> dict:
    space = {"x": {"grid_search": [1, 3]}, "steps": 2, "marker_dir": marker_dir}
    return jobs.base_spec(stack, name, "tune_testkit.functions:quadratic", param_space=space)


def test_the_submitted_spec_runs_and_one_swapped_in_storage_after_submission_is_refused(stack, tmp_path):
    # The control: the spec as submitted, with its digest, runs.
    name = jobs.unique_name("integrity-ok")
    spec = _spec(stack, name, str(tmp_path / "ok"))
    uri = job_spec_uri(f"{spec['storage_path']}/{name}", f"{name}-1", "t")
    data = spec_file_bytes(spec)
    storage.write_bytes(uri, data)
    job_id = _submit(stack, spec, engine_command(uri, digest_of(data)))
    assert jobs.wait(stack, job_id) == "SUCCEEDED", jobs.logs(stack, job_id)[-4000:]
    assert len(read_markers(str(tmp_path / "ok"), "start")) == 2

    # The same submission, but someone who may write to storage replaces the spec before the driver reads it.
    name = jobs.unique_name("integrity-swap")
    spec = _spec(stack, name, str(tmp_path / "submitted"))
    uri = job_spec_uri(f"{spec['storage_path']}/{name}", f"{name}-1", "t")
    data = spec_file_bytes(spec)
    storage.write_bytes(uri, data)
    swapped = {**spec, "param_space": {**spec["param_space"], "marker_dir": str(tmp_path / "swapped")}}
    storage.write_bytes(uri, spec_file_bytes(swapped))
    job_id = _submit(stack, spec, engine_command(uri, digest_of(data)))
    assert jobs.wait(stack, job_id) == "FAILED"
    text = jobs.logs(stack, job_id)
    assert f"the spec at {uri} is not the one submitted" in text, text[-4000:]
    assert jobs.exit_code(stack, job_id) == 2
    assert read_markers(str(tmp_path / "swapped")) == [] and read_markers(str(tmp_path / "submitted")) == []
    assert storage.read_json_or_none(jobs.result_uri(spec)) is None


def test_a_spec_read_from_storage_without_its_digest_is_refused(stack, tmp_path):
    name = jobs.unique_name("integrity-nodigest")
    spec = _spec(stack, name, str(tmp_path))
    uri = job_spec_uri(f"{spec['storage_path']}/{name}", f"{name}-1", "t")
    storage.write_bytes(uri, spec_file_bytes(spec))
    job_id = _submit(stack, spec, f"{ENGINE_ENTRYPOINT} --spec {shlex.quote(uri)}")
    assert jobs.wait(stack, job_id) == "FAILED"
    assert "without --spec-digest: a spec read from storage needs its digest" in jobs.logs(stack, job_id)
    assert read_markers(str(tmp_path)) == []
