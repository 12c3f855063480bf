"""The winner registered in MLflow's Model Registry (issue 24): PromoteCheckpointOperator with
``registry_uri="models:/<name>"`` against a real MLflow server (the local stack's, its artifacts and the checkpoints
on the session's real S3 endpoint), read back over plain HTTP (``MlflowRest``: no mlflow import on the test side).

The gates, the version's source and tags, the alias moved last, the Asset event, retry safety, registry faults and
their retries, warm start from ``models:/``, and deploy-side loading from ``models:/<name>@champion`` that refuses a
version airflow-tune did not write or whose checkpoint changed. Direct ``execute()`` runs use the S3 promotion tests'
reduced task instance; the DAG tests run ``dag.test()``.

Faults: the server down is a connection whose port nothing listens on (the real client, the real preflight); a fault
mid-promotion is injected at one ``MlflowClient`` call in a test-only subclass of the operator (every other call, and
the retry, real). Each fault and its retry run 10 times.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.exceptions import MLflowError, PromotionError
from airflow_tune.operators.promote import PromoteCheckpointOperator, registry_asset
from airflow_tune.registries import s3 as s3_registry
from tests.e2e.dags.mlflow_registry_cases import MLFLOW_REGISTRY, MLFLOW_TEMPLATED_REGISTRY
from tests.e2e.helpers import load_dag, run_dag
from tests.integration.test_promote import BUCKET, put_checkpoint, run, tune_result
from tests.support.mlflow_server import MlflowRest, mlflow_beside
from tests.support.sealed import sealed_result

FILE = "mlflow_registry_cases.py"
DAG_ID = "aft_promote_mlflow"
#: Rounds of each registry fault and its retry in one test: both kinds of round (a champion to keep, a new model) and
#: one more. Ten rounds showed them repeatable when written (c584860); 10-run loops of the file do that before a change
#: to them lands, so the suite need not repeat them ten times (about 2 min of a worker's time).
ROUNDS = 3


@pytest.fixture(scope="module")
def mlflow_url(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An MLflow server beside the session's stack, for this module only; stopped even when tests fail."""
    with mlflow_beside(stack, tmp_path_factory.mktemp("mlflow-registry")) as url:
        yield url


@pytest.fixture
def rest(mlflow_url: str) -> MlflowRest:
    return MlflowRest(mlflow_url)


@pytest.fixture
def s3(stack: Any) -> Any:
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=stack.s3_endpoint, region_name="us-east-1")


def model() -> str:
    return f"aft-it-{uuid.uuid4().hex[:10]}"


def promote_op(registry: str, result: Any, cls: type = PromoteCheckpointOperator, **kwargs: Any) -> Any:
    """The operator in the DAG of its registry (a registry belongs to the DAG that first promotes into it),
    ``result``'s experiment sealed for that DAG by a Ray job first."""
    import hashlib

    from airflow.sdk import DAG

    dag_id = f"aft_promote_mlflow_direct_{hashlib.sha256(registry.encode()).hexdigest()[:8]}"
    with DAG(dag_id, schedule=None):
        return cls(task_id="promote", result=sealed_result(result, dag_id), registry_uri=registry, **kwargs)


def _objects(s3: Any, uri: str) -> dict[str, bytes]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1 :]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


def tag_map(version: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in version.get("tags", [])}


def versions(rest: MlflowRest, name: str) -> list[dict[str, Any]]:
    found = rest.get("model-versions/search", filter=f"name='{name}'").get("model_versions", [])
    return sorted(found, key=lambda v: int(v["version"]))


def champion(rest: MlflowRest, name: str) -> str | None:
    """The version under the alias (from the model's aliases: a missing alias is a 400 from the alias endpoint)."""
    import urllib.error

    try:
        found = rest.get("registered-models/get", name=name)["registered_model"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return next((str(a["version"]) for a in found.get("aliases", []) if a["alias"] == "champion"), None)


def register_foreign(rest: MlflowRest, name: str, source: str, tags: dict[str, str] | None = None) -> str:
    """A version made by someone else (no airflow-tune tags unless given), under the champion alias."""
    try:
        rest.post("registered-models/create", {"name": name})
    except Exception:
        pass  # already there
    body = {"name": name, "source": source, "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}
    number = str(rest.post("model-versions/create", body)["model_version"]["version"])
    rest.post("registered-models/alias", {"name": name, "alias": "champion", "version": number})
    return number


# -- promotion, gates, tags, alias, Asset event --------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_the_winner_becomes_a_tagged_version_with_the_checkpoint_as_source_then_the_alias_then_the_event(rest, s3):
    name = model()
    source = put_checkpoint(s3, {"w.bin": b"weights", "meta/m.json": b"{}"})
    result = {**tune_result(source, 0.25), "mlflow": None}
    op = promote_op(f"models:/{name}", result)
    out, context = run(op)

    assert out["promoted"] is True and "no champion yet" in out["reason"], out
    [version] = versions(rest, name)
    assert out["version"] == version["version"] == "1" and out["model_uri"] == f"models:/{name}/1"
    # The source is the version's own copy of the checkpoint (proven as it was copied), outside the experiment.
    folder = f"s3://{BUCKET}/mlflow-models/{name}/versions/{out['version_name']}"
    assert out["uri"] == version["source"] == f"{folder}/checkpoint", version["source"]
    assert not version["source"].startswith(result["experiment_uri"])
    assert _objects(s3, out["uri"]) == {"w.bin": b"weights", "meta/m.json": b"{}"}
    assert champion(rest, name) == "1"
    tags = tag_map(version)
    assert (
        tags["airflow_tune.version"]
        == out["version_name"]
        == s3_registry.version_name(result, s3_registry.list_checkpoint(s3, source))
    )
    assert {k: tags[f"airflow_tune.{k}"] for k in ("metric", "mode", "experiment", "experiment_uri")} == {
        "metric": "loss",
        "mode": "min",
        "experiment": "exp-it",
        "experiment_uri": result["experiment_uri"],
    }
    assert json.loads(tags["airflow_tune.value"]) == 0.25
    assert json.loads(tags["airflow_tune.config"]) == {"x": 2.5, "lr": 0.01}
    assert tags["airflow_tune.checkpoint_uri"] == source and tags["airflow_tune.checkpoint_digest"].startswith(
        "sha256:"
    )
    assert (tags["airflow_tune.dag_id"], tags["airflow_tune.task_id"], tags["airflow_tune.run_id"]) == (
        op.dag_id,
        "promote",
        "manual__direct",
    )
    assert version["status"] == "READY"
    # The Asset is the registry URI, which every supported Airflow accepts unchanged.
    [outlet] = op.outlets
    assert outlet == registry_asset(f"models:/{name}") and outlet.uri == f"models:/{name}"
    # The event carries Airflow's record of what was registered: the digest of every file's, not the map.
    assert context["outlet_events"][outlet].extra == {
        "version": "1",
        "value": 0.25,
        "metric": "loss",
        "model_uri": f"models:/{name}/1",
        "registry": f"models:/{name}",
        "version_folder": folder,
        "files_digest": out["files_digest"],
        "file_count": 2,
    }
    assert out["registered_files"] == {
        "checkpoint/w.bin": "sha256:" + hashlib.sha256(b"weights").hexdigest(),
        "checkpoint/meta/m.json": "sha256:" + hashlib.sha256(b"{}").hexdigest(),
    }
    assert out["promoted_by"] == {
        "dag_id": op.dag_id,
        "run_id": "manual__direct",
        "task_id": "promote",
        "map_index": -1,
    }
    assert out["model_version_url"].endswith(f"/#/models/{name}/versions/1")


@pytest.mark.timeout(180)
def test_gates_promote_or_hold_back_and_a_held_back_winner_registers_nothing(rest, s3):
    name = model()
    registry = f"models:/{name}"

    def attempt(value: float, trial: str, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
        op = promote_op(
            registry, tune_result(put_checkpoint(s3, {"w.bin": trial.encode()}), value, trial=trial), **kwargs
        )
        out, context = run(op)
        return out, context, op

    first, _, _ = attempt(1.0, "first_00000")
    assert first["promoted"] and champion(rest, name) == first["version"]
    cases = [
        ({}, 2.0, False, "does not beat champion 1.0 (min)"),
        ({}, 1.0, False, "does not beat champion 1.0 (min)"),
        ({}, 0.5, True, "beats champion 1.0 (min)"),
        ({"gate": "threshold", "threshold": 0.4}, 0.45, False, "misses threshold 0.4 (min)"),
        ({"gate": "threshold", "threshold": "0.4"}, 0.4, True, "reaches threshold 0.4 (min)"),
        ({"gate": "always"}, 9.0, True, "gate 'always'"),
    ]
    for i, (kwargs, value, promoted, words) in enumerate(cases):
        before, alias_before = len(versions(rest, name)), champion(rest, name)
        out, context, op = attempt(value, f"case{i}_0000{i}", **kwargs)
        assert out["promoted"] is promoted and words in out["reason"], (kwargs, value, out["reason"])
        assert out["champion"]["version"] == alias_before
        if promoted:
            assert len(versions(rest, name)) == before + 1 and champion(rest, name) == out["version"]
            assert context["outlet_events"][op.outlets[0]].extra["version"] == out["version"]
        else:
            assert len(versions(rest, name)) == before, "a held-back winner is not registered"
            assert champion(rest, name) == alias_before and out["version"] is None
            assert op.outlets == [] and dict(context["outlet_events"]._dict) == {}


@pytest.mark.timeout(120)
def test_a_champion_without_our_tags_is_compared_with_nothing_and_said_so(rest, s3):
    name = model()
    register_foreign(rest, name, f"s3://{BUCKET}/elsewhere/model")
    out, _ = run(promote_op(f"models:/{name}", tune_result(put_checkpoint(s3, {"w.bin": b"w"}), 3.0)))
    assert out["promoted"] is True, out
    assert "champion version 1 has no airflow_tune.value tag (not ours): compared with nothing" in out["reason"]
    assert champion(rest, name) == "2" and out["champion"]["value"] is None


@pytest.mark.timeout(120)
def test_a_retry_after_the_alias_moved_registers_nothing_twice_and_emits_the_same_event(rest, s3):
    name = model()
    result = tune_result(put_checkpoint(s3, {"w.bin": b"w"}), 0.5)
    out1, context1 = run(promote_op(f"models:/{name}", result))
    out2, context2 = run(promote_op(f"models:/{name}", result))
    assert out2["promoted"] is True and "already the champion (a retry): nothing to do" in out2["reason"]
    assert out2["version"] == out1["version"] == "1" and out2["uri"] == out1["uri"]
    assert [v["version"] for v in versions(rest, name)] == ["1"] and champion(rest, name) == "1"
    [outlet] = context2["task"].outlets
    assert context2["outlet_events"][outlet].extra == context1["outlet_events"][outlet].extra


# -- faults --------------------------------------------------------------------------------------------------------
class FaultAtOneCall(PromoteCheckpointOperator):
    """Test-only: one MlflowClient call fails as a network or server fault would; every other call is real.

    ``after``: the call reaches the server and takes effect, then its answer is lost (a reset connection);
    otherwise the server refuses it (HTTP 503) and nothing happens."""

    fault_call = "set_registered_model_alias"
    after = False

    def mlflow_registry(self, client: Any, name: str, server: str) -> Any:
        import requests
        from mlflow.exceptions import MlflowException

        real = getattr(client, self.fault_call)

        def failing(*args: Any, **kwargs: Any) -> Any:
            if self.after:
                real(*args, **kwargs)
                raise requests.exceptions.ConnectionError("injected: connection reset before the answer arrived")
            raise MlflowException("injected: HTTP 503 Service Unavailable", error_code="TEMPORARILY_UNAVAILABLE")

        setattr(client, self.fault_call, failing)
        return super().mlflow_registry(client, name, server)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("fault_call", "after", "words"),
    [
        ("create_model_version", True, "failed to create a version"),
        ("set_registered_model_alias", False, "failed to move the alias 'champion'"),
    ],
)
def test_a_registry_error_mid_promotion_fails_the_task_with_the_alias_unmoved_and_the_retry_completes(
    rest, s3, fault_call, after, words
):
    for round_ in range(ROUNDS):
        name = model()
        # Even rounds: a champion to keep; odd rounds: a new model (the failed try may leave it with no alias).
        old_version = None
        if round_ % 2 == 0:
            old = run(promote_op(f"models:/{name}", tune_result(put_checkpoint(s3, {"w.bin": b"old"}), 1.0)))[0]
            old_version = old["version"]
        result = tune_result(put_checkpoint(s3, {"w.bin": b"new"}), 0.5, trial=f"new_{round_:05d}")
        faulty = promote_op(f"models:/{name}", result, cls=FaultAtOneCall)
        faulty.fault_call, faulty.after = fault_call, after
        with pytest.raises(MLflowError, match=words) as failed:
            run(faulty)
        assert "injected" in str(failed.value), failed.value
        assert champion(rest, name) == old_version, f"round {round_}: the alias moved on a failed try"

        retried, context = run(promote_op(f"models:/{name}", result))
        assert retried["promoted"] is True, (round_, retried)
        tagged = [v for v in versions(rest, name) if tag_map(v).get("airflow_tune.version") == retried["version_name"]]
        assert [v["version"] for v in tagged] == [retried["version"]], f"round {round_}: not exactly one version"
        expected = "2" if old_version else "1"
        assert champion(rest, name) == retried["version"] == expected, round_
        assert context["outlet_events"][context["task"].outlets[0]].extra["version"] == expected


@pytest.mark.timeout(300)
def test_a_registry_that_does_not_answer_fails_the_task_naming_it_and_the_retry_completes(rest, s3, monkeypatch):
    from airflow_tune.local.ports import free_port

    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DOWN", json.dumps({"conn_type": "http", "host": down}))
    for round_ in range(ROUNDS):
        name = model()
        old = run(promote_op(f"models:/{name}", tune_result(put_checkpoint(s3, {"w.bin": b"old"}), 1.0)))[0]
        result = tune_result(put_checkpoint(s3, {"w.bin": b"new"}), 0.5, trial=f"new_{round_:05d}")
        with pytest.raises(MLflowError, match="does not answer") as failed:
            run(promote_op(f"models:/{name}", result, mlflow_conn_id="mlflow_down"))
        assert down in str(failed.value) and "'mlflow_down'" in str(failed.value)
        assert champion(rest, name) == old["version"] and len(versions(rest, name)) == 1

        retried, _ = run(promote_op(f"models:/{name}", result))
        assert retried["promoted"] is True and champion(rest, name) == retried["version"] == "2", round_
        assert len(versions(rest, name)) == 2


# -- DAGs: downstream skipped, Asset events, templated arguments ---------------------------------------------------
def _listing_digest(s3: Any, uri: str) -> str:
    import hashlib

    from airflow_tune.registries.s3 import list_checkpoint

    objects = list_checkpoint(s3, uri)
    entries = sorted((o["rel"], int(o.get("Size") or 0), str(o.get("ETag") or "").strip('"')) for o in objects)
    return "sha256:" + hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode()).hexdigest()


def _result(s3: Any, weights: bytes, loss: float, trial: str) -> dict[str, Any]:
    return tune_result(put_checkpoint(s3, {"w.bin": weights}), loss, trial=trial)


def _unique_date() -> datetime:
    return datetime(2004, 4, 4, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


@pytest.mark.timeout(180)
def test_in_a_dag_a_held_back_winner_skips_the_deploy_and_a_promoted_one_is_deployed_from_the_alias(rest, s3):
    from tests.e2e.test_promote_dags import _asset_events, _queued_runs, _unpause_and_clear_queue

    name = MLFLOW_REGISTRY.removeprefix("models:/")
    register_foreign(
        rest, name, f"s3://{BUCKET}/seed/model", {"airflow_tune.value": "0.1", "airflow_tune.metric": "loss"}
    )
    seeded = champion(rest, name)
    worse = run_dag(
        load_dag("aft_promote_mlflow", FILE),
        {
            "result": sealed_result(
                tune_result(put_checkpoint(s3, {"w.bin": b"worse"}), 0.5, trial="worse_00000"), DAG_ID, run_id=None
            )
        },
        logical_date=_unique_date(),
    )
    assert worse.state == "success", (worse.task_states(), worse.errors("promote"))
    assert worse.task_states() == {"tune": "success", "promote": "success", "deploy": "skipped"}
    assert "does not beat champion 0.1 (min)" in worse.xcom("promote")["reason"]
    assert _asset_events("aft_promote_mlflow", worse.run_id) == [] and champion(rest, name) == seeded

    _unpause_and_clear_queue("aft_promote_mlflow_consumer")
    better = run_dag(
        load_dag("aft_promote_mlflow", FILE),
        {
            "result": sealed_result(
                tune_result(put_checkpoint(s3, {"w.bin": b"better"}), 0.05, trial="better_00001"), DAG_ID, run_id=None
            )
        },
        logical_date=_unique_date(),
    )
    assert better.state == "success", (better.task_states(), better.errors("promote"), better.errors("deploy"))
    decision = better.xcom("promote")
    assert decision["promoted"] is True and champion(rest, name) == decision["version"]
    # The deploy task loaded models:/<name>@champion: the promoted checkpoint's bytes.
    assert better.xcom("deploy") == {"deployed": decision["version"], "weights": "better"}
    assert _asset_events("aft_promote_mlflow", better.run_id) == [
        (
            MLFLOW_REGISTRY,
            {
                "version": decision["version"],
                "value": 0.05,
                "metric": "loss",
                "model_uri": decision["model_uri"],
                "registry": MLFLOW_REGISTRY,
                "version_folder": decision["version_folder"],
                "files_digest": decision["files_digest"],
                "file_count": 1,
            },
        )
    ]
    assert _queued_runs("aft_promote_mlflow_consumer") == [MLFLOW_REGISTRY]


@pytest.mark.timeout(180)
def test_the_threshold_rendered_from_a_param_and_the_result_as_a_json_string(rest, s3):
    name = MLFLOW_TEMPLATED_REGISTRY.removeprefix("models:/")
    result = sealed_result(
        tune_result(put_checkpoint(s3, {"w.bin": b"w"}), 0.3), "aft_promote_mlflow_templated", run_id=None
    )
    ran = run_dag(
        load_dag("aft_promote_mlflow_templated", FILE),
        {"result": result, "threshold": "0.5"},
        logical_date=_unique_date(),
    )
    assert ran.state == "success", (ran.task_states(), ran.errors("promote"))
    decision = ran.xcom("promote")
    assert decision["promoted"] is True and "reaches threshold 0.5 (min)" in decision["reason"]
    assert champion(rest, name) == decision["version"] == "1"


# -- warm start and deploy-side loading ----------------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_warm_start_from_the_mlflow_champion_and_without_one(rest, s3):
    """One real tune run from ``models:/<name>@champion`` (written in the DAG file: a model's name is not data); the
    bare form and a model without a champion through the operator's own warm-start step (what build_spec calls),
    which a tune run would not add to."""
    from airflow.sdk import DAG

    from tests.e2e.dags.promote_cases import WARM_SPACE, _warm_tune
    from tests.e2e.test_promote_dags import FILE as PROMOTE_CASES
    from tests.e2e.test_promote_dags import _manifest

    name = "aft-warm-start"  # the model aft_warm_start_mlflow's DAG file names
    result = {**tune_result(put_checkpoint(s3, {"w.bin": b"w"}), 0.2), "best_config": {"x": 2.5, "steps": 7}}
    run(promote_op(f"models:/{name}", result))
    warm = run_dag(load_dag("aft_warm_start_mlflow", PROMOTE_CASES), None, logical_date=_unique_date())
    assert warm.state == "success", (warm.task_states(), warm.errors("tune"))
    spec, manifest = _manifest(s3, warm.xcom("tune"))
    assert spec["points_to_evaluate"] == [{"x": 2.5}]  # only the sampled key
    assert manifest["num_trials"] == 2

    with DAG(f"aft_warm_direct_{uuid.uuid4().hex[:8]}", schedule=None):
        bare = _warm_tune("bare", f"models:/{name}")
        missing = _warm_tune("missing", f"models:/{model()}@champion")
    assert bare.warm_start_point(WARM_SPACE) == {"x": 2.5}
    assert missing.warm_start_point(WARM_SPACE) is None


@pytest.mark.timeout(120)
def test_download_and_load_from_the_alias_or_a_version_and_refuse_what_we_did_not_write(rest, s3, tmp_path):
    from airflow_tune.checkpoints import download_checkpoint, load_checkpoint

    name = model()
    files = {"w.bin": b"weights", "nested/state.json": b'{"step": 3}'}
    source = put_checkpoint(s3, files)
    out, _ = run(promote_op(f"models:/{name}", tune_result(source, 0.5)))

    def read(folder: str) -> dict[str, bytes]:
        return {str(p.relative_to(folder)): p.read_bytes() for p in Path(folder).rglob("*") if p.is_file()}

    assert read(download_checkpoint(f"models:/{name}@champion", str(tmp_path / "a"))) == files
    assert read(download_checkpoint(out["model_uri"], str(tmp_path / "b"))) == files
    checkpoint = load_checkpoint(f"models:/{name}@champion")
    assert read(checkpoint.to_directory(str(tmp_path / "c"))) == files

    # Someone else's version under the alias (no tags of ours), and one whose tag names another checkpoint.
    foreign = register_foreign(rest, name, source)
    with pytest.raises(PromotionError, match=f"version {foreign} .* was not registered by airflow-tune"):
        download_checkpoint(f"models:/{name}@champion", str(tmp_path / "d"))
    ours = tag_map(versions(rest, name)[0])
    other = put_checkpoint(s3, {"w.bin": b"evil"})
    register_foreign(rest, name, other, ours)
    with pytest.raises(PromotionError, match="is not the folder a promotion into this registered model writes"):
        load_checkpoint(f"models:/{name}@champion")

    # A registry writer's version, every tag self-consistent: a planted checkpoint, its true content digest, and a
    # result.json beside it naming both; no Ray job of that experiment vouched for it, so it is refused.
    from airflow_tune.common import storage
    from airflow_tune.common.contract import RESULT_FILE, manifest_uri
    from tests.support.sealed import manifest_for

    planted = put_checkpoint(s3, {"w.bin": b"a registry writer's pickle"})
    forged = tune_result(planted, 0.01)
    storage.write_bytes(
        manifest_uri(forged["experiment_uri"], RESULT_FILE), json.dumps(manifest_for(forged, "x", "nojob")).encode()
    )
    forged_tags = {
        **ours,
        "airflow_tune.checkpoint_uri": planted,
        "airflow_tune.experiment_uri": forged["experiment_uri"],
        # The digest main checked before (of the listing: key, size, ETag), computed by the writer of the tags.
        "airflow_tune.checkpoint_digest": _listing_digest(s3, planted),
    }
    from airflow_tune.registries.mlflow import version_folder_uri

    register_foreign(
        rest, name, version_folder_uri(planted, name, ours["airflow_tune.version"]) + "/checkpoint", forged_tags
    )
    with pytest.raises(PromotionError, match="is not proven by the experiment it names.*unknown to the cluster"):
        download_checkpoint(f"models:/{name}@champion", str(tmp_path / "forged"))
    assert not (tmp_path / "forged").exists()

    # Our version, but its checkpoint's copy in storage changed since: refused.
    bucket, key = out["uri"][len("s3://") :].split("/", 1)
    s3.put_object(Bucket=bucket, Key=f"{key}/w.bin", Body=b"tampered")
    with pytest.raises(PromotionError, match="are not the ones its trial wrote"):
        download_checkpoint(out["model_uri"], str(tmp_path / "e"))
    with pytest.raises(MLflowError, match="no such model version"):
        download_checkpoint(f"models:/{name}/99", str(tmp_path / "f"))
    with pytest.raises(ValueError, match="give models:/<name>@<alias> or models:/<name>/<version>"):
        download_checkpoint("models:/", str(tmp_path / "g"))


# -- registries are code positions and belong to their DAG (issue 30) ----------------------------------------------
def owner_tag(rest: MlflowRest, name: str) -> dict[str, list[str]] | None:
    """The registered model's record of its DAGs (each DAG that promoted into it and the DAGs its file lists)."""
    found = rest.get("registered-models/get", name=name)["registered_model"]
    tag = next((t["value"] for t in found.get("tags", []) if t["key"] == "airflow_tune.registry_dags"), None)
    return json.loads(tag)["dags"] if tag is not None else None


@pytest.mark.timeout(300)
def test_a_conf_named_model_and_another_dag_writing_the_first_dag_s_model_are_refused_with_the_champion_unmoved(
    rest, s3
):
    from airflow_tune.registries.owner import RegistryOwnerError
    from airflow_tune.registries.promote_written import PromotionTargetError
    from tests.e2e.dags.registry_owner_cases import TEAM_A_MODEL

    name = TEAM_A_MODEL.removeprefix("models:/")

    def trigger(dag_id: str, loss: float, **conf: Any) -> Any:
        result = sealed_result(
            tune_result(put_checkpoint(s3, {"w.bin": f"{dag_id} {loss}".encode()}), loss), dag_id, run_id=None
        )
        dag = load_dag(dag_id, "registry_owner_cases.py")
        return run_dag(dag, {"result": result, **conf}, logical_date=_unique_date())

    def refused(run_: Any) -> BaseException:
        assert run_.task_states() == {"tune": "success", "promote": "failed"}, run_.errors("promote")
        [error] = run_.errors("promote")
        return error

    first = trigger("aft_owner_team_a_mlflow", 0.4)
    assert first.state == "success", (first.task_states(), first.errors("promote"))
    before = (versions(rest, name), champion(rest, name))

    error = refused(trigger("aft_owner_team_b_conf_mlflow", 0.01, model=name))
    assert isinstance(error, PromotionTargetError), error
    assert str(error).startswith(f"registry_uri = {TEAM_A_MODEL!r}: the DAG file did not write this MLflow registry")

    error = refused(trigger("aft_owner_team_b_takes_a_mlflow", 0.01))
    assert isinstance(error, RegistryOwnerError), error
    assert str(error).startswith(
        f"the registry {TEAM_A_MODEL} belongs to DAG(s) 'aft_owner_team_a_mlflow': "
        "DAG 'aft_owner_team_b_takes_a_mlflow'"
    )
    assert "0.4" not in str(error) and "version" not in str(error)  # the owner's DAG id, never a value of the model
    assert (versions(rest, name), champion(rest, name)) == before
    assert owner_tag(rest, name) == {"aft_owner_team_a_mlflow": ["aft_owner_team_a_mlflow"]}  # its first promotion's

    again = trigger("aft_owner_team_a_mlflow", 0.3)
    assert again.state == "success" and again.xcom("promote")["promoted"] is True
    assert champion(rest, name) == again.xcom("promote")["version"] != before[1]


@pytest.mark.timeout(120)
def test_a_model_from_before_owner_tags_is_adopted_by_its_first_promotion(rest, s3):
    name = model()
    register_foreign(rest, name, f"s3://{BUCKET}/elsewhere/model")
    assert owner_tag(rest, name) is None
    op = promote_op(f"models:/{name}", tune_result(put_checkpoint(s3, {"w.bin": b"w"}), 3.0))
    out, _ = run(op)
    assert out["promoted"] is True and owner_tag(rest, name) == {op.dag_id: [op.dag_id]}


@pytest.mark.timeout(180)
def test_an_mlflow_writer_aliasing_another_dag_s_sealed_checkpoint_as_champion_is_refused_at_load(rest, s3, tmp_path):
    """A writer of the MLflow registry copies another DAG's proven version (its source and tags, whose proof is
    real) into this model and moves the champion alias to it: a load believes only versions whose experiment ran
    for one of the model's DAGs (before, any DAG's sealed checkpoint passed)."""
    from airflow_tune.checkpoints import download_checkpoint
    from airflow_tune.exceptions import PromotionError

    ours, theirs = model(), model()
    out, _ = run(promote_op(f"models:/{ours}", tune_result(put_checkpoint(s3, {"w.bin": b"ours"}), 0.5)))
    other = promote_op(f"models:/{theirs}", tune_result(put_checkpoint(s3, {"w.bin": b"theirs"}), 0.4))
    assert out["promoted"] is True and run(other)[0]["promoted"] is True
    assert download_checkpoint(f"models:/{ours}@champion", str(tmp_path / "ours")) == str(tmp_path / "ours")
    # The writer also holds the model folders' storage: it copies the other version's files where a promotion into
    # this model would have written them, so only the DAG check stands between it and the deploy.
    from airflow_tune.registries.mlflow import version_folder_uri

    [version] = versions(rest, theirs)
    tags = tag_map(version)
    theirs_folder, ours_folder = (
        version_folder_uri(tags["airflow_tune.checkpoint_uri"], name, tags["airflow_tune.version"])
        for name in (theirs, ours)
    )
    bucket, _, prefix = theirs_folder.removeprefix("s3://").partition("/")
    _, _, ours_prefix = ours_folder.removeprefix("s3://").partition("/")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            key = ours_prefix + obj["Key"][len(prefix) :]
            s3.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": obj["Key"]})
    moved = {k: v.replace(theirs_folder, ours_folder) for k, v in tags.items()}
    register_foreign(rest, ours, version["source"].replace(theirs_folder, ours_folder), moved)
    with pytest.raises(PromotionError, match=f"ran for DAG '{other.dag_id}', which is not one of the registry's DAGs"):
        download_checkpoint(f"models:/{ours}@champion", str(tmp_path / "forged"))
    assert not (tmp_path / "forged").exists()
