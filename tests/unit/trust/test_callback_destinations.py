"""Where a Tune logger sends data is never data: a URL argument of a logger callback (MLflow's ``tracking_uri`` and
``registry_uri``) is accepted only when the DAG file wrote it in ``callbacks``; one that appears only after rendering
(a Param, a trigger conf, an XCom) is refused before the Ray cluster is contacted, naming the field, the URL's host
(never its user) and the fix. A URL the DAG file wrote, and a logger without one (the cluster's own environment
chooses), keep working. Pure logic: the hook fails the test on any call to the Jobs API."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from airflow.sdk import DAG, task

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.operators.tune import RayTuneOperator
from tests.unit.trust.test_security import _execute, _run_until_submit

OUTSIDE = "https://collector.example:8443"


def _mlflow(**args: Any) -> list[dict[str, Any]]:
    return [{"name": "mlflow", "args": {"experiment_name": "x", **args}}]


def _refused(params: dict[str, Any], native: bool = False, **kwargs: Any) -> str:
    with pytest.raises(ValueError) as info:
        _execute(params, native=native, **kwargs)
    return str(info.value)


#: (id, the callbacks argument as the DAG file writes it, the params a run renders it with, native rendering).
RENDERED = [
    ("tojson", "{{ params.cbs | tojson }}", {"cbs": _mlflow(tracking_uri=OUTSIDE)}, False),
    ("python-literal", "{{ params.cbs }}", {"cbs": _mlflow(tracking_uri=OUTSIDE)}, False),
    ("native", "{{ params.cbs }}", {"cbs": _mlflow(tracking_uri=OUTSIDE)}, True),
    ("value-templated", _mlflow(tracking_uri="{{ params.uri }}"), {"uri": OUTSIDE}, False),
    ("host-templated", _mlflow(tracking_uri="https://{{ params.host }}:8443"), {"host": "collector.example"}, False),
    (
        "json-string-host-templated",
        '[{"name": "mlflow", "args": {"tracking_uri": "https://{{ params.host }}:8443"}}]',
        {"host": "collector.example"},
        False,
    ),
    # The params are the DAG's own defaults here (written in the DAG file), but a conf replaces them: data.
    ("value-templated-native", _mlflow(tracking_uri="{{ params.uri }}"), {"uri": OUTSIDE}, True),
]


@pytest.mark.parametrize(("case", "callbacks", "params", "native"), RENDERED, ids=[c[0] for c in RENDERED])
def test_a_rendered_tracking_uri_is_refused_before_the_cluster_is_contacted(case, callbacks, params, native):
    message = _refused(params, native=native, callbacks=callbacks)
    assert "callbacks[0].args.tracking_uri" in message
    assert "collector.example" in message  # the host, so the reader knows what was refused
    assert "mlflow_tracking" in message and "mlflow_conn_id" in message and "DAG file" in message


def test_the_registry_uri_is_a_destination_too_and_each_is_named():
    cbs = ["csv", {"name": "mlflow", "args": {"tracking_uri": OUTSIDE, "registry_uri": "http://reg.example:5000"}}]
    message = _refused({"cbs": cbs}, callbacks="{{ params.cbs | tojson }}")
    assert "callbacks[1].args.tracking_uri" in message and "collector.example" in message
    assert "callbacks[1].args.registry_uri" in message and "reg.example" in message


def test_the_refusal_shows_the_host_never_the_user():
    message = _refused({"cbs": _mlflow(tracking_uri="https://alice@collector.example/")}, callbacks="{{ params.cbs }}")
    assert "collector.example" in message and "alice" not in message


@pytest.mark.parametrize(
    "callbacks",
    [
        _mlflow(tracking_uri=OUTSIDE, registry_uri="http://reg.example:5000"),
        json.dumps(_mlflow(tracking_uri=OUTSIDE)),
        # A template elsewhere in the same argument leaves the written URL written.
        _mlflow(tracking_uri=OUTSIDE, experiment_name="{{ params.name }}"),
        '[{"name": "mlflow", "args": {"tracking_uri": "' + OUTSIDE + '", "experiment_name": "{{ params.name }}"}}]',
    ],
    ids=["python", "json-string", "python-templated-elsewhere", "json-string-templated-elsewhere"],
)
def test_a_tracking_uri_written_in_the_dag_file_is_accepted(callbacks):
    op = _run_until_submit({"name": "from-conf"}, callbacks=callbacks)
    [entry] = op.submitted_spec.callbacks
    assert entry["args"]["tracking_uri"] == OUTSIDE


def test_an_mlflow_logger_without_a_uri_may_come_from_data():
    # MLflow's own environment on the cluster (MLFLOW_TRACKING_URI) chooses the server: the deployment's.
    op = _run_until_submit({"cbs": ["csv", *_mlflow(tags={"team": "ml"})]}, callbacks="{{ params.cbs | tojson }}")
    assert op.submitted_spec.callbacks == ["csv", *_mlflow(tags={"team": "ml"})]


def test_a_written_url_does_not_license_another_rendered_beside_it():
    callbacks = [
        {"name": "mlflow", "args": {"tracking_uri": OUTSIDE, "registry_uri": "{{ params.uri }}"}},
    ]
    message = _refused({"uri": "https://elsewhere.example"}, callbacks=callbacks)
    assert "callbacks[0].args.registry_uri" in message and "elsewhere.example" in message
    assert "callbacks[0].args.tracking_uri" not in message


def _mapped(callbacks: Any) -> tuple[Any, Any]:
    """The DAG of one task mapped over ``callbacks``, and the operator a run builds from its one mapped value."""
    with DAG("mapped_destinations", schedule=None) as dag:
        RayTuneOperator.partial(
            task_id="tune", trainable="pkg.mod:train", storage_path="s3://bkt/e", metric="loss", mode="min"
        ).expand(callbacks=callbacks)
    return dag, dag.task_dict["tune"].unmap({"callbacks": _mlflow(tracking_uri=OUTSIDE)})


def test_callbacks_mapped_from_an_xcom_license_no_url_and_a_literal_expand_list_does():
    """A mapped task is built at run time with the expanded values as its arguments: they look written by the DAG
    file, but an XCom chose them. A literal list given to ``expand()`` is the DAG file's."""

    @task
    def chosen() -> list[list[dict[str, Any]]]:
        return [_mlflow(tracking_uri=OUTSIDE)]

    spec = ExperimentSpec.from_dict(
        {"trainable": "pkg.mod:train", "name": "e", "storage_path": "s3://bkt/e", "metric": "loss", "mode": "min"}
        | {"callbacks": _mlflow(tracking_uri=OUTSIDE)}
    )
    for source, refused in ((chosen, True), (lambda: [_mlflow(tracking_uri=OUTSIDE)], False)):
        dag, op = _mapped(source())
        with (
            mock.patch.object(RayTuneOperator, "dag", dag),
            mock.patch.object(RayTuneOperator, "has_dag", lambda _: True),
        ):
            if refused:
                with pytest.raises(ValueError, match=r"callbacks\[0\]\.args\.tracking_uri = host 'collector\.exa"):
                    op.check_destinations(spec)
            else:
                op.check_destinations(spec)


# -- the pieces -------------------------------------------------------------------------------------------------------
def test_the_destinations_of_a_spec_are_its_loggers_url_arguments():
    from airflow_tune.common.spec.callbacks import callback_destinations

    cbs = [
        "csv",
        {"name": "MLflowLoggerCallback", "args": {"tracking_uri": "http://a:1", "experiment_name": "http://not-one"}},
        {"name": "wandb", "args": {"project": "p"}},
        {"factory": "pkg.cb:make", "args": {"url": "http://custom"}},  # a factory's arguments are its code's to read
        {"name": "mlflow", "args": {"registry_uri": "http://b:2"}},
    ]
    assert callback_destinations(cbs) == [
        ("callbacks[1].args.tracking_uri", "http://a:1"),
        ("callbacks[4].args.registry_uri", "http://b:2"),
    ]
    assert callback_destinations(None) == [] and callback_destinations("csv") == []


def test_literal_destinations_are_the_urls_the_dag_file_wrote():
    from airflow_tune.trust.code import literal_destinations

    assert literal_destinations(_mlflow(tracking_uri=OUTSIDE)) == {OUTSIDE}
    assert literal_destinations(json.dumps(_mlflow(tracking_uri=OUTSIDE))) == {OUTSIDE}
    assert literal_destinations("{{ params.cbs }}") == set()
    assert literal_destinations(_mlflow(tracking_uri="https://{{ params.h }}")) == set()
    assert literal_destinations('[{"args": {"tracking_uri": "https://{{ params.h }}/", "x": "http://a:1"}}]') == {
        "http://a:1"
    }
