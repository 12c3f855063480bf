"""Every file the product writes is strict JSON a browser's ``JSON.parse`` reads, with NaN, +inf and -inf in configs
and metrics (written as "NaN", "Infinity", "-Infinity"); a spec with such numbers is refused before submission."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import manifest_uri
from airflow_tune.common.spec import ExperimentSpec, SpecError
from tests.support.engine_jobs import base_spec, run_ok, unique_name

pytestmark = pytest.mark.usefixtures("stack")


def strict_loads(text: str | bytes) -> Any:
    """Like ``JSON.parse``: the tokens NaN, Infinity and -Infinity are not JSON."""

    def refuse(token: str) -> Any:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.timeout(240)
def test_manifests_and_the_model_card_are_strict_json_with_non_finite_configs_and_metrics(stack, s3_client):
    spec = base_spec(
        stack,
        unique_name("strict-json"),
        "tune_testkit.functions:non_finite",
        param_space={
            "x": {"grid_search": [1, 2]},
            "nan": {"sample_from": "tune_testkit.functions:sample_nan"},
            "infs": {"sample_from": "tune_testkit.functions:sample_inf"},
        },
    )
    _, result = run_ok(stack, spec)
    experiment_uri = result["experiment_uri"]
    texts = {name: storage.read_bytes(manifest_uri(experiment_uri, name)) for name in ("spec.json", "progress.json")}
    texts["result.json"] = storage.read_bytes(manifest_uri(experiment_uri, "result.json"))
    parsed = {name: strict_loads(text) for name, text in texts.items()}

    manifest = parsed["result.json"]
    assert manifest["best_config"]["nan"] == "NaN" and manifest["best_config"]["infs"] == ["Infinity", "-Infinity"]
    assert manifest["best_metrics"]["diverged"] == "NaN"
    assert manifest["best_metrics"]["ceiling"] == "Infinity" and manifest["best_metrics"]["floor"] == "-Infinity"
    assert manifest["best_metrics"]["loss"] == 1.0
    for trial in manifest["trials"]:
        assert trial["metrics"]["diverged"] == "NaN" and trial["config"]["nan"] == "NaN"
    assert parsed["progress.json"]["best"]["config"]["infs"] == ["Infinity", "-Infinity"]

    # The promotion's model card and champion pointer, from this result.
    from tests.integration.test_promote import operator, run

    registry = f"s3://{stack.bucket}/{spec['name']}-registry"
    xcom = {k: v for k, v in manifest.items() if k != "trials"}
    decision, _ = run(operator(registry, xcom, gate="always"))
    assert decision["promoted"], decision
    bucket, _, prefix = registry[len("s3://") :].partition("/")
    for key in (f"{prefix}/champion.json", f"{prefix}/versions/{decision['version']}/model.json"):
        card = strict_loads(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
        assert card["config"]["nan"] == "NaN", key


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"trainable_kwargs": {"x": float("nan")}}, "trainable_kwargs.x = NaN"),
        ({"trainable_kwargs": {"bounds": [float("-inf"), float("inf")]}}, "trainable_kwargs.bounds[0] = -Infinity"),
        ({"param_space": {"x": {"choice": [1.0, float("inf")]}}}, "param_space.x.choice[1] = Infinity"),
        ({"param_space": {"x": float("nan")}}, "param_space.x = NaN"),
        (
            {"points_to_evaluate": [{"x": float("nan")}], "param_space": {"x": {"uniform": [0, 1]}}},
            "points_to_evaluate",
        ),
    ],
)
def test_a_spec_with_non_finite_numbers_is_refused_naming_the_field(fields, named):
    data = {"trainable": "m:f", "name": "n", "storage_path": "s3://bkt/x", "metric": "loss", "mode": "min", **fields}
    with pytest.raises(SpecError) as info:
        ExperimentSpec.from_dict(data)
    assert named in str(info.value) and "strict JSON has no NaN or infinity" in str(info.value)
