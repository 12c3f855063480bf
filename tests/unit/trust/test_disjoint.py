"""Experiments are disjoint (airflow_tune/trust/disjoint.py): an experiment folder inside another experiment's folder
(its trials, its best checkpoint) or a registry's, or holding one, is refused naming the field, the folder and its
owner, never the other spec's values; siblings, a retry and ordinary folders pass; the listing below a new folder is
bounded and the probes above it cost a few requests a level (a dict as the store; S3's paging through moto in process; a
local folder through pyarrow). tests/e2e/test_disjoint.py runs the same rule through Airflow on the real stack."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_tune.common.spec.naming import parse_storage_uri
from airflow_tune.exceptions import ExperimentStorageError
from airflow_tune.trust import disjoint
from airflow_tune.trust.disjoint import NestedFolderError, check_experiment_folder, first_nested, nested_in
from tests.support.fake_store import DictStore

ROOT = "s3://bkt/exps"
SECRET = "secret-value-of-the-other-spec"
OWNER_A = {"dag_id": "dag_a", "task_id": "tune", "map_index": -1, "run_id": None}
TRIAL = "stepper_1a2b3_00000_0_x=3"


def _experiment(files: dict[str, Any], folder: str, owner: dict[str, Any] | None = OWNER_A) -> None:
    """An experiment as this version leaves it: its job's spec first, then spec.json, Tune's files, a checkpoint."""
    spec = {"name": folder.rsplit("/", 1)[1], "param_space": {"token": SECRET}, "owner": owner}
    files[f"{folder}/.airflow_tune/jobs/exp-1-abc.json"] = spec
    files[f"{folder}/.airflow_tune/spec.json"] = spec
    files[f"{folder}/tuner.pkl"] = b"\x80"
    files[f"{folder}/{TRIAL}/checkpoint_000001/state.json"] = {"step": 1}


def _registry(files: dict[str, Any], folder: str, dag_id: str | None = "dag_r") -> None:
    files[f"{folder}/versions/1/checkpoint/state.json"] = {"step": 1}
    files[f"{folder}/versions/1/model.json"] = {"config": {"token": SECRET}}
    files[f"{folder}/champion.json"] = {"version": "1", "config": {"token": SECRET}}
    if dag_id:
        files[f"{folder}/owner.json"] = {"dag_id": dag_id}


def _check(files: dict[str, Any], storage_path: str, name: str = "exp", **kwargs: Any) -> DictStore:
    store = DictStore(files, parse_storage_uri(storage_path))
    check_experiment_folder(storage_path, name, kwargs.pop("root", ROOT), store=store, **kwargs)
    return store


def _refused(files: dict[str, Any], storage_path: str, name: str = "exp") -> str:
    with pytest.raises(NestedFolderError) as info:
        _check(files, storage_path, name)
    text = str(info.value)
    assert SECRET not in text and "param_space" not in text
    return text


# -- what passes -------------------------------------------------------------------------------------------------------
def test_a_new_experiment_beside_others_under_one_root_passes_in_a_few_requests():
    files: dict[str, Any] = {}
    _experiment(files, f"{ROOT}/team-a/first")
    _experiment(files, f"{ROOT}/second")
    store = _check(files, f"{ROOT}/team-a", "third")
    # Levels exps and team-a: three probes each; then the folder's own manifests and one listing of it.
    assert store.requests == 2 * 3 + 2 and store.walked == 0
    _check(files, ROOT, "team-b")


def test_a_retry_finds_its_own_manifests_and_does_not_list_below_them():
    files: dict[str, Any] = {}
    _experiment(files, f"{ROOT}/exp")
    for index in range(50):
        files[f"{ROOT}/exp/{TRIAL}/checkpoint_{index:06d}/x"] = b"x"
    store = _check(files, ROOT, "exp")
    assert store.walked == 0


def test_a_versions_folder_of_another_shape_and_a_versions_segment_on_the_path_are_not_registries():
    files = {f"{ROOT}/data/versions/2024/part-0.csv": b"x", f"{ROOT}/data/versions/2024/part-1.csv": b"x"}
    _check(files, f"{ROOT}/data", "exp")  # data/ holds versions/ of data, not of a registry
    _check(files, f"{ROOT}/data/versions", "exp")
    _experiment(files, f"{ROOT}/data/versions/v2/sibling")
    _check(files, f"{ROOT}/data/versions/v2", "exp")


def test_a_local_folder_has_no_registries_and_is_probed_through_pyarrow(tmp_path):
    (tmp_path / "exps" / "a" / "versions" / "1" / "checkpoint").mkdir(parents=True)
    (tmp_path / "exps" / "a" / "versions" / "1" / "checkpoint" / "x").write_bytes(b"x")
    check_experiment_folder(f"file://{tmp_path}/exps/a", "exp", f"file://{tmp_path}/exps")
    manifests = tmp_path / "exps" / "other" / ".airflow_tune"
    manifests.mkdir(parents=True)
    (manifests / "spec.json").write_text(json.dumps({"owner": OWNER_A}))
    with pytest.raises(NestedFolderError, match="storage_path = .* inside the folder of another experiment"):
        check_experiment_folder(f"{tmp_path}/exps/other/sub", "exp", f"file://{tmp_path}/exps")
    with pytest.raises(NestedFolderError, match=r"experiment_name = 'exps': .* holds the folder of another experiment"):
        check_experiment_folder(str(tmp_path), "exps", f"file://{tmp_path}")


# -- inside another ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "tail",
    [
        "first",  # the other experiment's folder itself as the storage path
        f"first/{TRIAL}",  # its trial's folder
        f"first/{TRIAL}/checkpoint_000001",  # its best checkpoint's folder
        "first/not-yet-there/deeper",
    ],
)
def test_a_storage_path_inside_another_experiment_is_refused_naming_the_field_folder_owner_and_fix(tail):
    files: dict[str, Any] = {}
    _experiment(files, f"{ROOT}/first")
    text = _refused(files, f"{ROOT}/{tail}")
    assert text.startswith(f"storage_path = '{ROOT}/{tail}': the experiment folder {ROOT}/{tail}/exp would lie inside ")
    assert f"the folder of another experiment, {ROOT}/first (DAG 'dag_a', task 'tune')" in text
    assert "changes its files (a checkpoint's content digests, which its deploys verify)" in text
    assert text.endswith(f"Choose a storage_path outside {ROOT}/first (beside it, for instance)")


def test_the_owner_shown_comes_from_the_first_job_spec_before_the_engine_wrote_spec_json_or_is_said_unknown():
    files: dict[str, Any] = {}
    _experiment(files, f"{ROOT}/first", {**OWNER_A, "map_index": 3})
    del files[f"{ROOT}/first/.airflow_tune/spec.json"]
    assert "(DAG 'dag_a', task 'tune', map index 3)" in _refused(files, f"{ROOT}/first/x")
    _experiment(files, f"{ROOT}/old", owner=None)
    assert "(no recorded owner (not written by this version of airflow-tune))" in _refused(files, f"{ROOT}/old/x")


def test_a_storage_path_with_a_manifest_segment_is_refused_without_a_request():
    with pytest.raises(NestedFolderError, match=r"storage_path = .*: has a '\.airflow_tune' segment"):
        _check({}, f"{ROOT}/first/.airflow_tune/jobs")


# -- holding another ---------------------------------------------------------------------------------------------------
def test_an_experiment_folder_holding_another_experiment_is_refused_naming_experiment_name():
    files: dict[str, Any] = {}
    _experiment(files, f"{ROOT}/team-a/inner/first")
    text = _refused(files, ROOT, "team-a")
    assert text.startswith(f"experiment_name = 'team-a': the experiment folder {ROOT}/team-a holds the folder of ")
    assert f"another experiment, {ROOT}/team-a/inner/first (DAG 'dag_a', task 'tune')" in text
    assert text.endswith("whose folder holds no experiment and no registry")
    text = _refused(files, f"{ROOT}/team-a", "inner")
    assert f"{ROOT}/team-a/inner holds the folder of another experiment, {ROOT}/team-a/inner/first" in text


def test_the_listing_below_a_new_folder_stops_at_the_first_find_and_at_its_bound(monkeypatch):
    files: dict[str, Any] = {f"{ROOT}/big/data/{index:04d}": b"x" for index in range(30)}
    monkeypatch.setattr(disjoint, "DESCENDANT_KEYS", 30)
    store = _check(files, ROOT, "big")  # exactly the bound, nothing found: passes
    assert store.walked == 30
    files[f"{ROOT}/big/data/9999"] = b"x"
    with pytest.raises(NestedFolderError, match="is new but already holds more than 30 objects"):
        _check(files, ROOT, "big")
    _experiment(files, f"{ROOT}/big/data/0000-inner")  # sorts before the rest: found at once
    store = DictStore(files, parse_storage_uri(ROOT))
    with pytest.raises(NestedFolderError, match="holds the folder of another experiment"):
        check_experiment_folder(ROOT, "big", ROOT, store=store)
    assert store.walked <= 3


def test_keys_that_show_a_nested_experiment_or_registry():
    assert nested_in((".airflow_tune", "spec.json"), True) is None  # the folder's own
    assert nested_in(("a", "b", ".airflow_tune", "jobs", "j.json"), True) == ("experiment", ("a", "b"))
    assert nested_in(("m", "champion.json"), True) == ("registry", ("m",))
    assert nested_in(("champion.json",), True) == ("registry", ())
    assert nested_in(("m", "versions", "3", "checkpoint", "w.bin"), True) == ("registry", ("m",))
    assert nested_in(("m", "versions", "3", "model.json"), True) == ("registry", ("m",))
    assert nested_in(("m", "versions", "2024", "part.csv"), True) is None
    assert nested_in(("m", "champion.json"), False) is None
    assert nested_in(("x", ".airflow_tune", "a", "versions", "1", "model.json"), True) == ("experiment", ("x",))
    assert first_nested(iter([("a",), ("b",)]), True, 1) == disjoint.TOO_MANY
    assert first_nested(iter([("a",)]), True, 1) is None


# -- registries --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tail", ["models/digits", "models/digits/versions/1/checkpoint", "models/digits/new"])
def test_a_storage_path_inside_a_registry_is_refused_naming_its_owner(tail):
    files: dict[str, Any] = {}
    _registry(files, f"{ROOT}/models/digits")
    text = _refused(files, f"{ROOT}/{tail}")
    assert text.startswith(f"storage_path = '{ROOT}/{tail}': the experiment folder {ROOT}/{tail}/exp would lie ")
    assert f"inside the folder of a model registry, {ROOT}/models/digits (DAG 'dag_r')" in text


def test_a_registry_with_only_versions_or_without_an_owner_record_is_a_registry_still():
    files: dict[str, Any] = {}
    _registry(files, f"{ROOT}/models/a", dag_id=None)
    del files[f"{ROOT}/models/a/champion.json"]
    text = _refused(files, f"{ROOT}/models/a/x")
    assert f"a model registry, {ROOT}/models/a (no recorded owner" in text


def test_an_experiment_folder_that_is_or_holds_a_registry_is_refused():
    files: dict[str, Any] = {}
    _registry(files, f"{ROOT}/models/digits")
    text = _refused(files, f"{ROOT}/models", "digits")
    assert f"the experiment folder {ROOT}/models/digits is the folder of a model registry (DAG 'dag_r')" in text
    text = _refused(files, ROOT, "models")
    assert f"{ROOT}/models holds the folder of a model registry, {ROOT}/models/digits (DAG 'dag_r')" in text


# -- reading storage ---------------------------------------------------------------------------------------------------
def test_a_level_above_the_root_that_cannot_be_read_is_skipped_and_logged_one_below_fails_the_task(caplog):
    files: dict[str, Any] = {}
    store = DictStore(files, parse_storage_uri(ROOT))
    store.unreadable = {"s3://bkt/exps"}
    with caplog.at_level(logging.WARNING, logger="disjoint-test"):
        check_experiment_folder(
            f"{ROOT}/team", "e", f"{ROOT}/team", store=store, log=logging.getLogger("disjoint-test")
        )
    assert "Not looking for experiments in s3://bkt/exps, above the storage root" in caplog.text
    with pytest.raises(ExperimentStorageError, match=r"cannot look for other experiments .* s3://bkt/exps/team/e"):
        check_experiment_folder(f"{ROOT}/team", "e", ROOT, store=store)
    with pytest.raises(ExperimentStorageError):
        check_experiment_folder(f"{ROOT}/team", "e", None, store=store)


@pytest.fixture
def s3(monkeypatch):
    from moto import mock_aws

    for key, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        import boto3

        client = boto3.client("s3")
        client.create_bucket(Bucket="bkt")
        yield client


class _Counting:
    def __init__(self, client: Any) -> None:
        self.client, self.calls = client, []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self.client, name)


def test_s3_is_listed_a_page_at_a_time_and_stops_at_the_first_find(s3, monkeypatch):
    monkeypatch.setattr(disjoint, "PAGE_KEYS", 2)
    for index in range(7):
        s3.put_object(Bucket="bkt", Key=f"exps/big/a/{index}", Body=b"x")
    s3.put_object(Bucket="bkt", Key="exps/big/b/inner/.airflow_tune/spec.json", Body=json.dumps({"owner": OWNER_A}))
    for index in range(20):
        s3.put_object(Bucket="bkt", Key=f"exps/big/c/{index:02d}", Body=b"x")
    counting = _Counting(s3)
    store = disjoint.S3Store("bkt", counting)
    with pytest.raises(NestedFolderError, match=r"holds the folder of another experiment, s3://bkt/exps/big/b/inner"):
        check_experiment_folder(ROOT, "big", ROOT, store=store)
    # exps: 3 probes; big's own manifests: 1; pages of 2 keys until b/inner (the 8th key): 4; the owner: 1.
    assert counting.calls.count("list_objects_v2") == 2 + 1 + 4 and counting.calls.count("get_object") == 1
    assert list(disjoint.S3Store("bkt", s3).walk(("exps", "big", "a"))) == [(str(i),) for i in range(7)]


def test_s3_probes_a_registry_and_a_missing_bucket_holds_nothing(s3):
    s3.put_object(Bucket="bkt", Key="exps/models/m/champion.json", Body=b"{}")
    s3.put_object(Bucket="bkt", Key="exps/models/m/owner.json", Body=json.dumps({"dag_id": "dag_r"}).encode())
    with pytest.raises(NestedFolderError, match=r"a model registry, s3://bkt/exps/models/m \(DAG 'dag_r'\)"):
        check_experiment_folder(f"{ROOT}/models/m/v", "exp", ROOT, store=disjoint.S3Store("bkt", s3))
    check_experiment_folder("s3://no-such-bucket/exps", "exp", "s3://no-such-bucket/exps")  # the write says so
    assert disjoint.S3Store("bkt", s3).read(("exps", "models", "m", "owner.json"), 5) == b'{"dag'


# -- the operator ------------------------------------------------------------------------------------------------------
def test_the_operator_refuses_before_writing_or_submitting(monkeypatch):
    from airflow_tune.operators.tune import RayTuneOperator
    from tests.support.fake_store import dict_stores

    files: dict[str, Any] = {}
    _experiment(files, f"{ROOT}/first")
    before = dict(files)
    monkeypatch.setattr("airflow_tune.trust.disjoint.store_for", dict_stores(files))
    monkeypatch.setattr("airflow_tune.common.storage.write_bytes", files.__setitem__)
    op = RayTuneOperator(
        task_id="tune",
        trainable="pkg.mod:train",
        storage_path=ROOT + "/{{ params.team }}",
        metric="loss",
        mode="min",
        experiment_name="second",
        ship_engine=False,
    )
    op.storage_path = f"{ROOT}/first/{TRIAL}"  # as a conf's team renders it
    submitted: list[Any] = []
    hook = SimpleNamespace(check_ray_version=lambda: "2.60.0", submit_job=lambda **kw: submitted.append(kw))
    op.__dict__["hook"] = hook
    context = {"ti": SimpleNamespace(dag_id="dag_b", task_id="tune", map_index=-1, try_number=1), "run_id": "r"}
    spec = op.build_spec(context)  # type: ignore[arg-type]
    with pytest.raises(NestedFolderError, match=f"storage_path = '{ROOT}/first/{TRIAL}': "):
        op.submit_experiment(context, spec, "second-1")  # type: ignore[arg-type]
    assert files == before and submitted == []
    assert op.storage_root == ROOT  # the root that admitted the rendered path: levels above it may be unreadable


def test_disjoint_imports_neither_airflow_nor_ray_nor_boto3_nor_pyarrow_at_import():
    code = (
        "import sys; import airflow_tune.trust.disjoint; "
        "print([m for m in ('ray', 'boto3', 'pyarrow', 'airflow') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_registry_layout_is_the_registrys_own():
    from airflow_tune.registries import owner as registry_owner
    from airflow_tune.registries import s3 as registry

    assert (disjoint.CHAMPION_FILE, disjoint.REGISTRY_OWNER_FILE) == (registry.CHAMPION_FILE, registry_owner.OWNER_FILE)
