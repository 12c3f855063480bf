"""PromoteCheckpointOperator.execute() against the real S3 endpoint: byte-equal server-side copies (multipart too),
the pointer written last, deterministic versions on retry, the gates, and bad arguments refused before any S3 call.

Every S3 call the operator makes is observed with botocore event hooks on boto3's default session (the session the
operator's own client comes from): observation only, the calls go to the real endpoint. The Airflow task instance is
reduced to what execute() reads (ids, xcom_push); the outlet events accessor is the Task SDK's own.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_tune.common.contract import inside_experiment
from airflow_tune.common.provenance import files_digest
from airflow_tune.exceptions import PromotionError
from airflow_tune.operators import promote as promote_module
from airflow_tune.operators.promote import CHAMPION_FILE, PromoteCheckpointOperator, registry_asset
from airflow_tune.registries import s3 as s3_registry
from tests.support.sealed import sealed_result
from tests.support.sealed import xcom_pull as sealed_xcom_pull

pytestmark = pytest.mark.usefixtures("stack")

BUCKET = "airflow-tune"
MIB = 1024 * 1024
WRITES = {"PutObject", "CopyObject", "UploadPartCopy", "UploadPart", "CreateMultipartUpload", "CompleteMultipartUpload"}


class S3Calls:
    """Each S3 operation's start (with its Bucket/Key) and end, in order, as seen by botocore event hooks."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str | None]] = []
        self.on_call: list[Any] = []

    def before(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        key = params.get("Key")
        context["aft_key"] = key
        for check in self.on_call:
            check(model.name, key)
        self.events.append(("start", model.name, key))

    def after(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        self.events.append(("end", model.name, context.get("aft_key")))

    def ops(self, phase: str = "start") -> list[tuple[str, str | None]]:
        return [(op, key) for ph, op, key in self.events if ph == phase]

    def clear(self) -> None:
        self.events.clear()


@pytest.fixture
def s3_calls() -> Iterator[S3Calls]:
    import boto3

    session = boto3._get_default_session()
    calls = S3Calls()
    uid = f"aft-promote-{uuid.uuid4().hex}"
    session.events.register("before-parameter-build.s3", calls.before, unique_id=f"{uid}-before")
    session.events.register("after-call.s3", calls.after, unique_id=f"{uid}-after")
    try:
        yield calls
    finally:
        session.events.unregister("before-parameter-build.s3", unique_id=f"{uid}-before")
        session.events.unregister("after-call.s3", unique_id=f"{uid}-after")


@pytest.fixture
def reader(stack) -> Any:
    """A separate client (not the default session's, so its calls are not observed)."""
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=stack.s3_endpoint, region_name="us-east-1")


class _TaskInstance:
    """What execute() reads of the task instance."""

    dag_id = "aft_promote_direct"
    task_id = "promote"
    map_index = -1

    def __init__(self) -> None:
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value

    # Airflow's record of the stand-in tune task instances' jobs (sealed_result's).
    xcom_pull = staticmethod(sealed_xcom_pull)


def run(op: PromoteCheckpointOperator) -> tuple[dict[str, Any], dict[str, Any]]:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    ti = _TaskInstance()
    ti.dag_id = op.dag_id  # the operator's own DAG, as Airflow's task instance has it
    context: dict[str, Any] = {
        "ti": ti,
        "task": op,
        "run_id": "manual__direct",
        "outlet_events": OutletEventAccessors(),
    }
    return op.execute(context), context  # type: ignore[arg-type]


def operator(registry: str, result: Any, *, seal: bool = True, **kwargs: Any) -> PromoteCheckpointOperator:
    """The operator in the DAG of its registry (a registry belongs to the DAG that first promotes into it);
    ``result``'s experiment sealed for that DAG by a Ray job first, as the engine's job would have (``seal=False``: as
    given, e.g. a forged XCom)."""
    import hashlib

    from airflow.sdk import DAG

    dag_id = f"aft_promote_direct_{hashlib.sha256(registry.encode()).hexdigest()[:8]}"
    if seal and isinstance(result, dict) and _sealable(result):
        result = sealed_result(result, dag_id)
    with DAG(dag_id, schedule=None):
        return PromoteCheckpointOperator(task_id="promote", result=result, registry_uri=registry, **kwargs)


def _sealable(result: dict[str, Any]) -> bool:
    checkpoint = result.get("best_checkpoint_uri")
    return "experiment_uri" in result and (
        checkpoint is None or inside_experiment(checkpoint, result["experiment_uri"])
    )


def registry_uri() -> str:
    return f"s3://{BUCKET}/registry-it/{uuid.uuid4().hex[:10]}"


def put_checkpoint(s3: Any, files: dict[str, bytes], name: str = "checkpoint_000002") -> str:
    prefix = f"exp-it/{uuid.uuid4().hex[:10]}/trial_0/{name}"
    for rel, body in files.items():
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=body)
    return f"s3://{BUCKET}/{prefix}"


def tune_result(
    checkpoint: str | None, value: float | None, mode: str = "min", trial: str = "abcde_00000"
) -> dict[str, Any]:
    """Shaped like RayTuneOperator's XCom result; the experiment is the checkpoint's (``.../<experiment>/trial_0/``)."""
    if checkpoint is None:
        experiment_uri = f"s3://{BUCKET}/exp-it/{uuid.uuid4().hex[:10]}"
    elif "/trial_0/" in checkpoint:
        experiment_uri = checkpoint.split("/trial_0/")[0]
    else:
        experiment_uri = f"s3://{BUCKET}/exp-it"
    return {
        "experiment": "exp-it",
        "experiment_uri": experiment_uri,
        "job_id": "raysubmit_it",
        "metric": "loss",
        "mode": mode,
        "best_trial_id": trial,
        "best_config": {"x": 2.5, "lr": 0.01},
        "best_metrics": {"loss": value, "training_iteration": 3},
        "best_checkpoint_uri": checkpoint,
        "num_trials": 2,
        "num_terminated": 2,
        "num_errored": 0,
        "dashboard_url": "http://127.0.0.1:8265/#/jobs/raysubmit_it",
    }


def op_files(files: dict[str, bytes]) -> dict[str, str]:
    """``{relative path: "sha256:<hex>"}`` of the files' bytes."""
    import hashlib

    return {rel: "sha256:" + hashlib.sha256(body).hexdigest() for rel, body in files.items()}


def objects_under(s3: Any, uri: str) -> dict[str, bytes]:
    bucket, prefix = promote_module.split_s3_uri(uri)
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1 :]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


def champion_bytes(s3: Any, registry: str) -> bytes | None:
    bucket, prefix = promote_module.split_s3_uri(registry)
    try:
        return bytes(s3.get_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}")["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None


def seed_champion(s3: Any, registry: str, value: float, mode: str = "min") -> bytes:
    bucket, prefix = promote_module.split_s3_uri(registry)
    body = json.dumps({"version": "seed", "value": value, "metric": "loss", "mode": mode, "config": {}}).encode()
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}", Body=body)
    return body


@pytest.mark.timeout(90)
def test_every_object_is_copied_through_the_worker_with_equal_bytes_including_a_multipart_one(
    s3_calls, reader, monkeypatch
):
    monkeypatch.setattr("airflow_tune.registries.transfer.PART", 5 * MIB)
    files = {
        "state.json": b'{"step": 2}',
        "model.bin": os.urandom(6 * MIB),  # > one part: CreateMultipartUpload + UploadPart x2
        "nested/deeper/weights.npy": os.urandom(4096),
        "empty.txt": b"",
        "nested/": b"",  # pyarrow's folder marker: not a file of the checkpoint
    }
    source = put_checkpoint(reader, files)
    # A sibling whose name starts with the checkpoint's: its objects are not part of the checkpoint.
    sibling = put_checkpoint(reader, {"other.bin": b"x"}, name="checkpoint_0000020")
    assert sibling.rsplit("/", 1)[0] != source.rsplit("/", 1)[0]
    reader.put_object(Bucket=BUCKET, Key=source.split(f"s3://{BUCKET}/")[1] + "0/not-mine.bin", Body=b"no")
    registry = registry_uri()

    out, context = run(operator(registry, tune_result(source, 0.25), gate="always"))

    assert out["promoted"] is True and out["reason"] == "gate 'always'"
    expected = {rel: body for rel, body in files.items() if not rel.endswith("/")}
    copied = objects_under(reader, out["uri"])
    assert sorted(copied) == sorted(expected)
    for rel, body in expected.items():
        assert copied[rel] == body, f"{rel} differs after the copy"
    assert out["uri"] == f"{registry}/versions/{out['version']}/checkpoint"

    model = json.loads(objects_under(reader, f"{registry}/versions/{out['version']}")["model.json"])
    assert {f["key"]: f["size"] for f in model["files"]} == {rel: len(body) for rel, body in expected.items()}
    assert model["provenance"]["source_checkpoint_uri"] == source and model["config"] == {"x": 2.5, "lr": 0.01}
    pointer = json.loads(champion_bytes(reader, registry) or b"")
    assert pointer["version"] == out["version"] and pointer["uri"] == out["uri"] and pointer["value"] == 0.25
    assert pointer["config"] == {"x": 2.5, "lr": 0.01}

    # Through the worker: each checkpoint file read once (GetObject) and written once, the large one in 5 MiB parts;
    # no server-side copy (it cannot see the bytes it registers).
    ops = s3_calls.ops()
    source_prefix = promote_module.split_s3_uri(source)[1]
    checkpoint_keys = {f"{source_prefix}/{rel}" for rel in expected}
    assert sorted(key for op, key in ops if op == "GetObject" and key in checkpoint_keys) == sorted(checkpoint_keys)
    assert not [op for op, _ in ops if op in ("CopyObject", "UploadPartCopy")]
    dest = promote_module.split_s3_uri(out["uri"])[1]
    assert [key for op, key in ops if op == "UploadPart"] == [f"{dest}/model.bin"] * 2
    assert [key for op, key in ops if op == "CompleteMultipartUpload"] == [f"{dest}/model.bin"]
    assert sorted(key for op, key in ops if op == "PutObject" and key.startswith(f"{dest}/")) == sorted(
        f"{dest}/{rel}" for rel in expected if rel != "model.bin"
    )
    assert {f["key"]: f["digest"] for f in model["files"]} == op_files(expected)
    puts = [key for op, key in ops if op == "PutObject" and not key.startswith(f"{dest}/")]
    registry_prefix = promote_module.split_s3_uri(registry)[1]  # the owner record first: the registry's first promotion
    assert puts == [
        f"{registry_prefix}/owner.json",
        f"{dest.rsplit('/', 1)[0]}/registered.json",
        f"{dest.rsplit('/', 1)[0]}/model.json",
        f"{registry_prefix}/champion.json",
    ]
    # The XCom records every file registered (the digests of the bytes the copy read), the Asset event their digest.
    assert out["registered_files"] == {f"checkpoint/{k}": v for k, v in op_files(expected).items()}
    assert out["files_digest"] == files_digest(out["registered_files"]) == model["files_digest"]
    [outlet] = context["task"].outlets
    assert outlet == registry_asset(registry)
    assert context["outlet_events"][outlet].extra == {
        "version": out["version"],
        "value": 0.25,
        "metric": "loss",
        "registry": registry,
        "version_folder": f"{registry}/versions/{out['version']}",
        "files_digest": out["files_digest"],
        "file_count": len(expected),
    }


@pytest.mark.timeout(90)
def test_the_pointer_moves_last_and_a_reader_following_it_always_finds_every_file(s3_calls, reader, monkeypatch):
    monkeypatch.setattr("airflow_tune.registries.transfer.PART", 5 * MIB)
    registry = registry_uri()
    bucket, prefix = promote_module.split_s3_uri(registry)
    seen: list[str | None] = []

    def follow_pointer(op: str, key: str | None) -> None:
        """Before each S3 call the operator makes: whatever champion.json names is complete."""
        raw = champion_bytes(reader, registry)
        if raw is None:
            seen.append(None)
            return
        pointer = json.loads(raw)
        model = json.loads(objects_under(reader, pointer["model_uri"].rsplit("/", 1)[0])["model.json"])
        present = objects_under(reader, pointer["uri"])
        for entry in model["files"]:
            assert len(present[entry["key"]]) == entry["size"], (op, key, entry)
        seen.append(pointer["version"])

    s3_calls.on_call.append(follow_pointer)
    first = put_checkpoint(reader, {"a.txt": b"first", "big.bin": os.urandom(6 * MIB)})
    out1, _ = run(operator(registry, tune_result(first, 2.0, trial="aaaaa_00001")))
    second = put_checkpoint(reader, {"a.txt": b"second", "big.bin": os.urandom(6 * MIB), "more/b.txt": b"b"})
    out2, _ = run(operator(registry, tune_result(second, 1.0, trial="bbbbb_00002")))
    follow_pointer("after both", None)

    assert out1["promoted"] and out2["promoted"] and out1["version"] != out2["version"]
    assert "no champion yet" in out1["reason"] and "beats champion 2.0" in out2["reason"]
    # The reader saw no champion, then the first version, then the second: never anything in between.
    versions = [v for i, v in enumerate(seen) if i == 0 or v != seen[i - 1]]
    assert versions == [None, out1["version"], out2["version"]]
    # In the operator's own order, champion.json is the last write, after every copy and model.json ended.
    events = s3_calls.events
    pointer_puts = [i for i, (ph, op, key) in enumerate(events) if op == "PutObject" and key.endswith(CHAMPION_FILE)]
    assert len(pointer_puts) == 4  # start and end, two promotions
    for version, put_index in ((out1["version"], pointer_puts[0]), (out2["version"], pointer_puts[2])):
        mine = [
            (i, ph, op)
            for i, (ph, op, key) in enumerate(events)
            if key and key.startswith(f"{prefix}/versions/{version}/")
        ]
        assert mine and all(i < put_index for i, _, _ in mine), (version, mine, put_index)
        assert {op for _, _, op in mine} >= {"UploadPart", "CompleteMultipartUpload", "PutObject"}
        ends = [i for i, ph, _ in mine if ph == "end"]
        starts = [i for i, ph, _ in mine if ph == "start"]
        assert len(ends) == len(starts), "every copy and the model.json write ended before the pointer moved"
    assert json.loads(champion_bytes(reader, registry) or b"")["version"] == out2["version"]
    assert objects_under(reader, out2["uri"])["a.txt"] == b"second"
    assert objects_under(reader, out1["uri"])["a.txt"] == b"first", "the old version stays in the registry"
    assert bucket == BUCKET


@pytest.mark.timeout(60)
def test_a_retried_promotion_rewrites_the_same_version_and_still_counts_as_promoted(s3_calls, reader):
    registry = registry_uri()
    source = put_checkpoint(reader, {"w.bin": b"weights", "meta/m.json": b"{}"})
    result = tune_result(source, 0.5)
    out1, _ = run(operator(registry, result))
    pointer1 = json.loads(champion_bytes(reader, registry) or b"")
    s3_calls.clear()
    # The retry: the same result, the champion already points at this version (better_than_champion must not
    # compare the winner with itself and skip the deploy).
    out2, context = run(operator(registry, result))
    assert out2["promoted"] is True and "already the champion" in out2["reason"]
    assert out2["version"] == out1["version"] and out2["uri"] == out1["uri"]
    pointer2 = json.loads(champion_bytes(reader, registry) or b"")
    assert {k: v for k, v in pointer2.items() if k != "promoted_at"} == {
        k: v for k, v in pointer1.items() if k != "promoted_at"
    }
    listing = reader.list_objects_v2(Bucket=BUCKET, Prefix=promote_module.split_s3_uri(registry)[1] + "/versions/")
    versions = {obj["Key"].split("/versions/")[1].split("/")[0] for obj in listing["Contents"]}
    assert versions == {out1["version"]}
    assert objects_under(reader, out2["uri"]) == {"w.bin": b"weights", "meta/m.json": b"{}"}
    [outlet] = context["task"].outlets
    assert context["outlet_events"][outlet].extra["version"] == out1["version"]
    # A different run of the same result is the same version too (named from the checkpoint, not the clock).
    assert s3_registry.version_name(result, s3_registry.list_checkpoint(reader, source)) == (out1["version"])


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("mode", "champion", "challenger", "promoted", "words"),
    [
        ("min", 1.0, 2.0, False, "does not beat champion 1.0 (min)"),
        ("min", 1.0, 1.0, False, "does not beat champion 1.0 (min)"),
        ("min", 1.0, 0.5, True, "beats champion 1.0 (min)"),
        ("max", 0.9, 0.8, False, "does not beat champion 0.9 (max)"),
        ("max", 0.9, 0.9, False, "does not beat champion 0.9 (max)"),
        ("max", 0.9, 0.95, True, "beats champion 0.9 (max)"),
        ("min", 1.0, math.nan, False, "does not beat"),
        ("max", 0.9, None, False, "does not beat"),
    ],
)
def test_better_than_champion_gate(s3_calls, reader, mode, champion, challenger, promoted, words):
    registry = registry_uri()
    before = seed_champion(reader, registry, champion, mode)
    source = put_checkpoint(reader, {"w.bin": b"w"})
    s3_calls.clear()
    out, context = run(operator(registry, tune_result(source, challenger, mode)))
    assert out["promoted"] is promoted and words in out["reason"], out["reason"]
    assert out["champion"]["value"] == champion
    if promoted:
        assert json.loads(champion_bytes(reader, registry) or b"")["version"] == out["version"]
        assert context["task"].outlets == [registry_asset(registry)]
    else:
        assert champion_bytes(reader, registry) == before
        assert out["version"] is None and out["uri"] is None
        assert not [op for op, _ in s3_calls.ops() if op in WRITES], "a worse challenger writes nothing"
        assert context["task"].outlets == [], "no Asset event when not promoted"
        assert dict(context["outlet_events"]._dict) == {}


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("mode", "threshold", "value", "promoted", "words"),
    [
        ("min", 1.0, 1.0, True, "reaches threshold 1.0 (min)"),
        ("min", "1.0", 0.2, True, "reaches threshold 1.0 (min)"),
        ("min", 1.0, 1.5, False, "misses threshold 1.0 (min)"),
        ("max", 0.9, 0.95, True, "reaches threshold 0.9 (max)"),
        ("max", 0.9, 0.5, False, "misses threshold 0.9 (max)"),
    ],
)
def test_threshold_gate_ignores_the_champion(s3_calls, reader, mode, threshold, value, promoted, words):
    registry = registry_uri()
    # A champion far better than anything here: the threshold gate does not compare with it.
    before = seed_champion(reader, registry, -100.0 if mode == "min" else 100.0, mode)
    source = put_checkpoint(reader, {"w.bin": b"w"})
    s3_calls.clear()
    out, _ = run(operator(registry, tune_result(source, value, mode), gate="threshold", threshold=threshold))
    assert out["promoted"] is promoted and words in out["reason"], out["reason"]
    if not promoted:
        assert champion_bytes(reader, registry) == before
        assert not [op for op, _ in s3_calls.ops() if op in WRITES]


@pytest.mark.timeout(60)
def test_always_promotes_a_worse_challenger_and_no_checkpoint_is_never_promoted(s3_calls, reader):
    registry = registry_uri()
    seed_champion(reader, registry, 0.1)
    source = put_checkpoint(reader, {"w.bin": b"w"})
    out, _ = run(operator(registry, tune_result(source, 5.0), gate="always"))
    assert out["promoted"] is True and json.loads(champion_bytes(reader, registry) or b"")["value"] == 5.0

    for gate in ("always", "better_than_champion", "threshold"):
        before = champion_bytes(reader, registry)
        s3_calls.clear()
        out, context = run(operator(registry, tune_result(None, 0.0), gate=gate, threshold=10.0))
        assert out["promoted"] is False and out["reason"] == "the best trial saved no checkpoint", (gate, out)
        assert champion_bytes(reader, registry) == before
        assert not [op for op, _ in s3_calls.ops() if op in WRITES]
        assert context["task"].outlets == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"registry_uri": "gs://bucket/models/x"}, ValueError, "not an s3:// URI"),
        ({"registry_uri": "/local/models/x"}, ValueError, "not an s3:// URI"),
        ({"registry_uri": "s3://airflow-tune"}, ValueError, "give a prefix"),
        ({"gate": "best"}, ValueError, "use one of always, better_than_champion, threshold"),
        ({"gate": "threshold"}, ValueError, "needs a number"),
        ({"gate": "threshold", "threshold": "high"}, ValueError, "needs a number"),
        ({"gate": "threshold", "threshold": math.inf}, ValueError, "finite"),
        ({"result": ["not", "a", "dict"]}, TypeError, "got list"),
        ({"result": {"best_config": {}}}, TypeError, "best_metrics"),
        ({"result": "not json"}, ValueError, "Expecting value"),
        ({"result": {"metric": "loss", "mode": "maximize", "best_metrics": {}}}, ValueError, "'min' or 'max'"),
        # An edited XCom pointing at a checkpoint the experiment did not write (deploy tasks unpickle it).
        ({"result": {**tune_result("s3://other-bucket/m/checkpoint_1", 0.1)}}, ValueError, "lies outside"),
        ({"result": {**tune_result(f"s3://{BUCKET}/exp-it/../x/checkpoint_1", 0.1)}}, ValueError, "lies outside"),
        ({"result": {**tune_result(f"s3://{BUCKET}/exp-it-other/checkpoint_1", 0.1)}}, ValueError, "lies outside"),
    ],
)
def test_bad_arguments_fail_at_execute_before_any_s3_call(s3_calls, reader, kwargs, error, words):
    source = put_checkpoint(reader, {"w.bin": b"w"})
    args: dict[str, Any] = {"registry_uri": registry_uri(), "result": tune_result(source, 0.1), **kwargs}
    registry, result = args.pop("registry_uri"), args.pop("result")
    op = operator(registry, result, **args)  # accepted at parse time (arguments may be templates)
    s3_calls.clear()
    with pytest.raises(error, match=words):
        run(op)
    assert s3_calls.events == [], "no S3 call at all, so certainly no write"


# -- the hand-off: what is promoted and loaded is what the experiment's own job vouched for (issue 30) ---------------


def _registry_untouched(reader: Any, registry: str) -> bool:
    bucket, prefix = promote_module.split_s3_uri(registry)
    return "Contents" not in reader.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")


@pytest.mark.timeout(90)
def test_an_edited_xcom_result_is_not_promoted_the_sealed_result_decides(reader):
    source = put_checkpoint(reader, {"model.pkl": b"the trial's model"})
    planted = source.rsplit("/", 1)[0] + "/checkpoint_000009"
    reader.put_object(Bucket=BUCKET, Key=promote_module.split_s3_uri(planted)[1] + "/model.pkl", Body=b"planted")
    registry = registry_uri()
    op = operator(registry, tune_result(source, 0.5), gate="always")
    op.result = {**op.result, "best_checkpoint_uri": planted}  # the XCom edited after the tune task ended
    with pytest.raises(PromotionError, match="best_checkpoint_uri.*is not what the experiment's sealed result says"):
        run(op)
    assert _registry_untouched(reader, registry)


@pytest.mark.timeout(90)
def test_a_result_rewritten_in_storage_after_its_job_sealed_it_is_not_promoted(reader):
    from airflow_tune.common import storage
    from airflow_tune.common.contract import RESULT_FILE, manifest_uri

    source = put_checkpoint(reader, {"model.pkl": b"the trial's model"})
    registry = registry_uri()
    op = operator(registry, tune_result(source, 0.5), gate="always")
    where = manifest_uri(op.result["experiment_uri"], RESULT_FILE)
    forged = json.loads(storage.read_bytes(where))
    forged["best_metrics"]["loss"] = -100.0  # a storage writer's better "winner"
    storage.write_bytes(where, json.dumps(forged).encode())
    with pytest.raises(PromotionError, match="its bytes are not the ones Ray job sealed-"):
        run(op)
    assert _registry_untouched(reader, registry)


@pytest.mark.timeout(90)
def test_a_result_sealed_for_another_dag_or_with_no_job_is_not_promoted(reader):
    source = put_checkpoint(reader, {"model.pkl": b"the trial's model"})
    registry = registry_uri()
    theirs = sealed_result(tune_result(source, 0.5), "another_teams_dag")
    with pytest.raises(PromotionError, match="ran another experiment"):
        run(operator(registry, theirs, seal=False, gate="always"))
    # A result.json written by hand names a job the cluster never ran.
    from airflow_tune.common import storage
    from airflow_tune.common.contract import RESULT_FILE, manifest_uri
    from tests.support.sealed import manifest_for

    other = put_checkpoint(reader, {"model.pkl": b"x"})
    forged = tune_result(other, 0.1)
    storage.write_bytes(
        manifest_uri(forged["experiment_uri"], RESULT_FILE), json.dumps(manifest_for(forged, "x", "nojob")).encode()
    )
    with pytest.raises(PromotionError, match="unknown to the cluster"):
        run(operator(registry, {**forged, "job_id": "nojob"}, seal=False, gate="always"))
    assert _registry_untouched(reader, registry)


@pytest.mark.timeout(90)
def test_a_checkpoint_with_files_its_trial_did_not_write_is_not_promoted(reader):
    source = put_checkpoint(reader, {"model.pkl": b"the trial's model"})
    registry = registry_uri()
    op = operator(registry, tune_result(source, 0.5), gate="always")
    reader.put_object(Bucket=BUCKET, Key=promote_module.split_s3_uri(source)[1] + "/extra.pkl", Body=b"added")
    with pytest.raises(PromotionError, match="holds other files than its trial wrote.*extra.pkl"):
        run(op)
    assert _registry_untouched(reader, registry)


@pytest.mark.timeout(120)
def test_the_champion_loads_only_proven_and_byte_for_byte_as_the_trial_wrote_it(reader, tmp_path):
    from airflow_tune.checkpoints import download_checkpoint
    from airflow_tune.registry import champion_checkpoint

    source = put_checkpoint(reader, {"model.pkl": b"the trial's model", "meta/config.json": b"{}"})
    registry = registry_uri()
    out, _ = run(operator(registry, tune_result(source, 0.5), gate="always"))
    uri, digest = champion_checkpoint(registry)
    assert uri == out["uri"]
    folder = download_checkpoint(uri, str(tmp_path / "ok"), expected_digest=digest)
    assert (tmp_path / "ok" / "model.pkl").read_bytes() == b"the trial's model" and folder == str(tmp_path / "ok")

    # The promoted copy's bytes swapped in storage: the download is refused and nothing is handed over.
    key = promote_module.split_s3_uri(uri)[1] + "/model.pkl"
    reader.put_object(Bucket=BUCKET, Key=key, Body=b"a registry writer's pickle")
    with pytest.raises(PromotionError, match="not the ones its trial wrote"):
        download_checkpoint(uri, str(tmp_path / "swapped"), expected_digest=digest)
    assert not (tmp_path / "swapped").exists()

    # A champion.json rewritten to point at a planted checkpoint, its digest computed by the writer: refused.
    planted = put_checkpoint(reader, {"model.pkl": b"planted"})
    bucket, prefix = promote_module.split_s3_uri(registry)
    pointer = json.loads(champion_bytes(reader, registry) or b"")
    pointer.update(uri=planted, source_checkpoint_uri=planted, experiment_uri=planted.split("/trial_0/")[0])
    reader.put_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}", Body=json.dumps(pointer).encode())
    with pytest.raises(PromotionError, match="outside its registry|not proven"):
        champion_checkpoint(registry)


# -- the promotion registers only bytes it read and proved (issue 40) ------------------------------------------------


class _Marker:
    """Unpickling this leaves a file: proof that someone ran ``pickle.loads`` on it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def _registry_keys(reader: Any, registry: str) -> list[str]:
    bucket, prefix = promote_module.split_s3_uri(registry)
    listed = reader.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
    return sorted(obj["Key"][len(prefix) + 1 :] for obj in listed)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("changed", ["model.pkl", "big.bin"])
def test_a_checkpoint_file_changed_after_the_experiment_ended_is_refused_and_nothing_is_registered(
    reader, tmp_path, monkeypatch, changed
):
    """The copy hashes the bytes it reads: a file rewritten in storage after the trial wrote it (a small one written
    with one put, a large one in parts) fails the promotion naming it; what was copied is deleted, no multipart upload
    is left open, and neither model.json nor champion.json is written. Nothing unpickles the planted file."""
    import pickle

    monkeypatch.setattr("airflow_tune.registries.transfer.PART", 5 * MIB)
    marker = tmp_path / "attacker-ran"
    source = put_checkpoint(reader, {"big.bin": os.urandom(6 * MIB), "model.pkl": pickle.dumps({"w": [1.0]})})
    registry = registry_uri()
    op = operator(registry, tune_result(source, 0.5), gate="always")  # sealed: the trial's bytes are recorded
    planted = pickle.dumps(_Marker(str(marker))) if changed == "model.pkl" else os.urandom(6 * MIB)
    reader.put_object(Bucket=BUCKET, Key=f"{promote_module.split_s3_uri(source)[1]}/{changed}", Body=planted)

    with pytest.raises(PromotionError, match=rf"changed in storage after its trial wrote it: the bytes of '{changed}'"):
        run(op)
    assert _registry_keys(reader, registry) == ["owner.json"], "no version, no model.json, no champion.json"
    bucket, prefix = promote_module.split_s3_uri(registry)
    assert not reader.list_multipart_uploads(Bucket=bucket, Prefix=f"{prefix}/").get("Uploads")
    assert not marker.exists()


@pytest.mark.timeout(120)
def test_a_file_added_to_a_checkpoint_after_the_experiment_ended_is_refused_and_nothing_is_registered(reader, tmp_path):
    import pickle

    marker = tmp_path / "attacker-ran"
    source = put_checkpoint(reader, {"model.pkl": pickle.dumps({"w": [1.0]})})
    registry = registry_uri()
    op = operator(registry, tune_result(source, 0.5), gate="always")
    added = pickle.dumps(_Marker(str(marker)))
    reader.put_object(Bucket=BUCKET, Key=f"{promote_module.split_s3_uri(source)[1]}/loader.pkl", Body=added)
    with pytest.raises(
        PromotionError, match="holds other files than its trial wrote.*not written by the trial: 'loader.pkl'"
    ):
        run(op)
    assert _registry_keys(reader, registry) == []
    assert not marker.exists()
