"""Storage roots: storage URIs are parsed, refused when not plain (naming the field), normalised, compared at segment
boundaries; filesystems are built from scheme and bucket only; a rendered storage path must lie under the root the
DAG file wrote or one the deployment allows (tests/e2e/test_storage_roots.py runs the same rules through Airflow)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_tune.common import storage
from airflow_tune.common.spec import ExperimentSpec, SpecError
from airflow_tune.common.spec.naming import StorageURIError, is_under, normalize_storage_uri, parse_storage_uri
from airflow_tune.get_provider_info import get_provider_info
from airflow_tune.hooks.connection import RayEndpoint
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.trust import roots
from airflow_tune.trust.roots import StorageRootError, check_storage_path, deployment_roots, literal_root, parse_roots

ROOTS_ENV = "AIRFLOW__AIRFLOW_TUNE__ALLOWED_STORAGE_ROOTS"

#: (id, storage path, words the refusal says). Every scheme we keep, file:// and plain absolute paths included.
REFUSED = [
    ("userinfo", "s3://user:pw@bucket/x", ["userinfo"]),
    ("userinfo-no-password", "s3://user@bucket/x", ["userinfo"]),
    ("gs-userinfo", "gs://user@bucket/x", ["userinfo"]),
    ("query-endpoint", "s3://bucket/x?endpoint_override=evil.example:9000", ["query string"]),
    ("query-empty", "s3://bucket/x?", ["query string"]),
    ("query-gs", "gs://bucket/x?anonymous=true", ["query string"]),
    ("query-file", "file:///data/x?x=1", ["query string"]),
    ("query-abs", "/data/x?x=1", ["query string"]),
    ("fragment", "s3://bucket/x#", ["fragment"]),
    ("fragment-swallows", "s3://bucket/team#/rest", ["fragment"]),
    ("fragment-file", "file:///data/x#y", ["fragment"]),
    ("port", "s3://bucket:9000/x", ["port"]),
    ("port-empty", "s3://bucket:/x", ["port"]),
    ("ipv6-authority", "s3://[::1]/x", ["authority"]),
    ("host-authority", "s3://evil.example.com..x/x", ["not a valid S3 bucket"]),
    ("uppercase-bucket", "s3://Bucket/x", ["not a valid S3 bucket"]),
    ("gs-bad-bucket", "gs://B/x", ["not a valid GCS bucket"]),
    ("no-bucket", "s3:///x", ["no bucket"]),
    ("file-host", "file://evil.example/x", ["no host", "file:///"]),
    ("file-localhost", "file://localhost/data", ["no host"]),
    ("dotdot", "s3://bucket/a/../b", ["'..'"]),
    ("dot", "s3://bucket/./b", ["'.'"]),
    ("dotdot-end", "s3://bucket/a/..", ["'..'"]),
    ("double-slash", "s3://bucket//b", ["empty segment"]),
    ("two-trailing-slashes", "s3://bucket/a//", ["empty segment"]),
    ("gs-dotdot", "gs://bucket/../other", ["'..'"]),
    ("file-dotdot", "file:///data/../etc", ["'..'"]),
    ("file-dot", "file:///data/./x", ["'.'"]),
    ("file-double-slash", "file:///data//x", ["empty segment"]),
    ("abs-dotdot", "/data/../etc", ["'..'"]),
    ("abs-leading-double-slash", "//data/x", ["empty segment"]),
    ("abs-root", "/", ["filesystem's root"]),
    ("file-root", "file:///", ["filesystem's root"]),
    ("backslash", "s3://bucket/a\\..\\b", ["backslash"]),
    ("file-backslash", "file:///data\\x", ["backslash"]),
    ("newline", "s3://bucket/a\nb", ["control character"]),
    ("tab", "file:///data/a\tb", ["control character"]),
    ("nul", "/data/a\x00b", ["control character"]),
    ("del", "s3://bucket/a\x7f", ["control character"]),
    ("space", "s3://bucket/my exps", ["space"]),
    ("trailing-space", "/data/x ", ["space"]),
    ("nbsp", "s3://bucket/a\u00a0b", ["whitespace"]),
    ("line-separator", "s3://bucket/a\u2028b", ["whitespace"]),
    ("bidi-override", "s3://bucket/a\u202eb", ["control character"]),
    ("pct-dotdot", "s3://bucket/%2e%2e/x", ["percent-escape"]),
    ("pct-slash", "s3://bucket/a%2Fb", ["percent-escape"]),
    ("pct-nul", "file:///data/a%00", ["percent-escape"]),
    ("pct-space", "/data/a%20b", ["percent-escape"]),
    ("pct-query", "s3://bucket/a%3Fx=1", ["percent-escape"]),
    ("pct-in-bucket", "s3://b%75cket/x", ["percent-escape"]),
    ("pct-double", "file:///data/%252e%252e", ["percent-escape"]),
    ("hdfs", "hdfs://namenode:8020/x", ["hdfs:// is not supported", "s3://"]),
    ("hdfs-plain", "hdfs://namenode/x", ["hdfs:// is not supported"]),
    ("abfs", "abfs://container@account.dfs.core.windows.net/x", ["abfs:// is not supported"]),
    ("abfss", "abfss://container@account.dfs.core.windows.net/x", ["abfss:// is not supported"]),
    ("az", "az://container/x", ["az:// is not supported"]),
    ("ftp", "ftp://host/x", ["unsupported scheme 'ftp'"]),
    ("relative", "experiments/x", ["relative"]),
    ("no-scheme-colon", "s3:bucket/x", ["relative"]),
    ("not-a-string", 3, ["must be a string"]),
]


@pytest.mark.parametrize(("uri", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_every_refused_form_is_refused_naming_the_field_the_value_and_a_fix(uri, words):
    with pytest.raises(StorageURIError) as info:
        parse_storage_uri(uri)
    text = str(info.value)
    assert text.startswith(f"storage_path = {uri!r}" if isinstance(uri, str) else "storage_path = 3"), text
    assert all(w in text for w in words), (words, text)
    assert "; " in text  # the fix follows the problem
    # The spec refuses it the same way, before anything runs.
    data = {"trainable": "m:f", "name": "n", "storage_path": uri, "metric": "loss", "mode": "min"}
    with pytest.raises(SpecError) as spec_info:
        ExperimentSpec.from_dict(data)
    [line] = [e for e in spec_info.value.errors if e.startswith("storage_path = ")]
    assert all(w in line for w in words), (words, line)
    # And storage never builds a filesystem for it.
    with pytest.raises(ValueError, match="storage URI = "):
        storage.resolve(uri)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("uri", "canonical"),
    [
        ("s3://bucket/experiments/team-a", "s3://bucket/experiments/team-a"),
        ("s3://bucket/experiments/", "s3://bucket/experiments"),
        ("S3://bucket/x", "s3://bucket/x"),
        ("s3://bucket", "s3://bucket"),
        ("s3://bucket/", "s3://bucket"),
        ("s3://my.bucket-1/a=1,b_2/run:3", "s3://my.bucket-1/a=1,b_2/run:3"),
        ("gs://bucket_x/p", "gs://bucket_x/p"),
        ("gcs://bucket/p", "gs://bucket/p"),
        ("file:///shared/experiments", "file:///shared/experiments"),
        ("FILE:///shared/experiments/", "file:///shared/experiments"),
        ("/shared/experiments", "file:///shared/experiments"),
        ("/shared/experiments/", "file:///shared/experiments"),
        ("/shared/équipe", "file:///shared/équipe"),
    ],
)
def test_legal_forms_and_their_canonical_form(uri, canonical):
    assert normalize_storage_uri(uri) == canonical
    assert normalize_storage_uri(canonical) == canonical
    ExperimentSpec.from_dict({"trainable": "m:f", "name": "n", "storage_path": uri, "metric": "loss", "mode": "min"})


@pytest.mark.parametrize(
    ("uri", "root", "under"),
    [
        ("s3://bucket/experiments/team-a", "s3://bucket/experiments", True),
        ("s3://bucket/experiments", "s3://bucket/experiments/", True),
        ("s3://bucket/experiments/a/b/c", "s3://bucket", True),
        ("s3://bucket/experimentsX", "s3://bucket/experiments", False),
        ("s3://bucket/exp", "s3://bucket/experiments", False),
        ("s3://bucket", "s3://bucket/experiments", False),
        ("s3://other/experiments/team-a", "s3://bucket/experiments", False),
        ("gs://bucket/experiments/a", "s3://bucket/experiments", False),
        ("gcs://bucket/experiments/a", "gs://bucket/experiments", True),
        ("/data/x/y", "file:///data/x", True),
        ("file:///data/x/y", "/data/x", True),
        ("file:///data/xy", "/data/x", False),
        ("file:///data/x", "s3://data/x", False),
    ],
)
def test_is_under_compares_canonical_forms_at_segment_boundaries(uri, root, under):
    assert is_under(uri, root) is under


def test_is_under_refuses_a_uri_it_cannot_parse():
    with pytest.raises(StorageURIError, match="'..'"):
        is_under("s3://bucket/experiments/../other", "s3://bucket/experiments")
    with pytest.raises(StorageURIError, match="root = "):
        is_under("s3://bucket/x", "s3://bucket/x?y=1")


# -- filesystems from scheme and bucket ------------------------------------------------------------------------------
def test_object_store_filesystems_are_built_from_scheme_and_bucket_only(monkeypatch):
    import pyarrow.fs

    asked: list[str] = []

    def from_uri(uri: str) -> Any:
        asked.append(uri)
        return pyarrow.fs.LocalFileSystem(), ""  # not S3: returned as it is

    monkeypatch.setattr(pyarrow.fs, "FileSystem", SimpleNamespace(from_uri=from_uri))
    storage._filesystem.cache_clear()
    try:
        _, path = storage.resolve("s3://bucket/experiments/team-a/exp/.airflow_tune/spec.json")
        assert path == "bucket/experiments/team-a/exp/.airflow_tune/spec.json"
        _, path = storage.resolve("gcs://bucket/p/")
        assert path == "bucket/p"
        fs, path = storage.resolve("file:///data/x/")
        assert isinstance(fs, pyarrow.fs.LocalFileSystem) and path == "/data/x"
        with pytest.raises(ValueError, match="query string"):
            storage.resolve("s3://bucket/x?endpoint_override=evil.example:9000")
    finally:
        storage._filesystem.cache_clear()
    assert asked == ["s3://bucket", "gs://bucket"]


def test_tune_gets_local_storage_in_canonical_form():
    assert storage.tune_storage("file:///shared/exps/") == ("file:///shared/exps", None)
    assert storage.tune_storage("/shared/exps/") == ("/shared/exps", None)
    with pytest.raises(ValueError, match="'..'"):
        storage.tune_storage("file:///shared/../etc")


def test_file_uris_are_written_with_their_folders_made(tmp_path):
    uri = f"file://{tmp_path}/exps/exp-1/.airflow_tune/jobs/exp-1-1-abc.json"
    storage.write_json(uri, {"spec": 1})
    assert json.loads((tmp_path / "exps/exp-1/.airflow_tune/jobs/exp-1-1-abc.json").read_text()) == {"spec": 1}
    assert storage.read_json(uri) == {"spec": 1}
    assert storage.list_files(f"file://{tmp_path}/exps") == [uri]
    assert [p.name for p in (tmp_path / "exps/exp-1/.airflow_tune/jobs").iterdir()] == ["exp-1-1-abc.json"]


# -- roots ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argument", "root"),
    [
        ("s3://bucket/experiments/{{ params.team }}", "s3://bucket/experiments"),
        ("s3://bucket/experiments/team-{{ params.team }}", "s3://bucket/experiments"),
        ("s3://bucket/{{ params.n }}x", "s3://bucket"),
        ("s3://bucket/experiments/{% if x %}a{% endif %}", "s3://bucket/experiments"),
        ("s3://bucket/experiments/{# note #}a", "s3://bucket/experiments"),
        ("s3://bucket/experiments", "s3://bucket/experiments"),
        ("s3://bucket/experiments/", "s3://bucket/experiments"),
        ("file:///shared/exps/{{ params.team }}", "file:///shared/exps"),
        ("/shared/exps/{{ params.team }}", "file:///shared/exps"),
        ("{{ params.path }}", None),
        ("s3://{{ params.bucket }}/experiments", None),
        ("s3://bucket{{ params.suffix }}/experiments", None),
        ("/{{ params.path }}", None),
        ("file:///{{ params.path }}", None),
        ("s3://bucket/a/../{{ params.x }}", None),
        ("s3://bucket/x?{{ params.q }}", "s3://bucket"),  # the rendered path is refused for its query
        (None, None),
        (SimpleNamespace(), None),
    ],
)
def test_the_literal_root_is_what_the_dag_file_wrote_before_any_template(argument, root):
    assert literal_root(argument) == root


def test_parse_roots_takes_a_list_a_json_list_or_comma_separated_uris():
    assert parse_roots(None) == [] and parse_roots("") == []
    assert parse_roots(" s3://a/x , file:///shared ,") == ["s3://a/x", "file:///shared"]
    assert parse_roots('["s3://a/x,y", "gs://b"]') == ["s3://a/x,y", "gs://b"]
    assert parse_roots(["s3://a/x", " "]) == ["s3://a/x"]
    for bad in (3, {"a": 1}, ["s3://a", 2], "[not json"):
        with pytest.raises(TypeError, match="allowed_storage_roots"):
            parse_roots(bad)


def test_deployment_roots_come_from_airflow_config_then_the_connection_read_lazily(monkeypatch):
    monkeypatch.setenv(ROOTS_ENV, "s3://shared/experiments/, /nfs/exps")
    asked = []

    def connection() -> list[str]:
        asked.append(1)
        return ["gs://other/x"]

    found = deployment_roots(connection)
    assert next(found) == "s3://shared/experiments" and next(found) == "file:///nfs/exps" and asked == []
    assert list(found) == ["gs://other/x"] and asked == [1]
    monkeypatch.setenv(ROOTS_ENV, "s3://shared/x?endpoint_override=e")
    with pytest.raises(ValueError, match=r"\[airflow_tune\] allowed_storage_roots = .*query string.*fix it there"):
        list(deployment_roots())
    monkeypatch.delenv(ROOTS_ENV)
    with pytest.raises(ValueError, match="the ray connection's extra allowed_storage_roots = 's3://x/../y'"):
        list(deployment_roots(["s3://x/../y"]))


def test_a_templated_tail_under_the_literal_root_is_legal_without_reading_the_deployment():
    root = literal_root("s3://bucket/experiments/{{ params.team }}")

    def never() -> list[str]:
        raise AssertionError("the deployment's roots were read")

    check_storage_path("s3://bucket/experiments/team-a", root, never)
    check_storage_path("s3://bucket/experiments/team-a/", root, never)
    check_storage_path("/shared/exps/run", literal_root("file:///shared/exps/{{ params.run }}"), never)
    # A literal file:// path is its own root.
    check_storage_path("file:///shared/exps", literal_root("file:///shared/exps"), never)


def test_a_deployment_root_admits_a_fully_templated_path():
    assert literal_root("{{ params.path }}") is None
    check_storage_path("s3://shared/experiments/team-b", None, ["gs://xyz", "s3://shared/experiments"])
    check_storage_path("file:///nfs/exps/a", None, lambda: ["file:///nfs/exps"])


@pytest.mark.parametrize(
    ("rendered", "literal"),
    [
        ("s3://other-bucket/experiments/team-a", "s3://bucket/experiments"),
        ("s3://bucket/experimentsX/team-a", "s3://bucket/experiments"),
        ("s3://bucket/elsewhere", "s3://bucket/experiments"),
        ("s3://bucket", "s3://bucket/experiments"),
        ("file:///etc/exps", "s3://bucket/experiments"),
        ("s3://bucket/experiments", None),
    ],
)
def test_a_rendered_path_under_no_root_is_refused_naming_the_field_the_value_and_the_fix(rendered, literal):
    with pytest.raises(StorageRootError) as info:
        check_storage_path(rendered, literal, ["s3://shared/x"])
    text = str(info.value)
    assert text.startswith(f"storage_path = {rendered!r}: lies under no storage root"), text
    assert "Write the root in the DAG file" in text and "allowed_storage_roots" in text
    assert "s3://shared/x" not in text  # the deployment's roots are counted, not shown
    assert "the deployment allows 1 root)" in text
    assert isinstance(info.value, ValueError)
    again = pickle_round_trip(info.value)
    assert str(again) == text


def test_a_rendered_path_that_is_not_plain_is_refused_before_any_root_is_compared():
    with pytest.raises(StorageURIError, match="storage_path = .*fragment"):
        check_storage_path("s3://bucket/experiments/a#b", "s3://bucket/experiments", [])


def pickle_round_trip(exc: BaseException) -> BaseException:
    import pickle

    return pickle.loads(pickle.dumps(exc))  # noqa: S301 - our own exception, as it crosses a process


# -- the operator ----------------------------------------------------------------------------------------------------
class NoRayHook:
    """Only the deployment's roots; anything else (a submission, a job lookup) fails the test."""

    def __init__(self, roots: tuple[str, ...] = ()) -> None:
        self.roots = roots
        self.asked = 0

    @property
    def allowed_storage_roots(self) -> tuple[str, ...]:
        self.asked += 1
        return self.roots

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the hook was used: {name}")


def _build(storage_path: str, params: dict[str, Any], hook: NoRayHook | None = None) -> Any:
    with DAG("roots", schedule=None, params=params) as dag:
        op = RayTuneOperator(
            task_id="tune", trainable="pkg.mod:train", storage_path=storage_path, metric="loss", mode="min"
        )
    op.__dict__["hook"] = hook or NoRayHook()
    ti = SimpleNamespace(dag_id="roots", task_id="tune", map_index=-1, try_number=1, start_date=None)
    context = {"params": params, "ti": ti, "task_instance": ti, "run_id": "manual__1", "dag": dag, "task": op}
    op.render_template_fields(context)  # type: ignore[arg-type]
    return op.build_spec(context)  # type: ignore[arg-type]


def test_the_operator_keeps_the_readme_team_example_legal_without_a_connection():
    hook = NoRayHook()
    spec = _build("s3://bucket/experiments/{{ params.team }}", {"team": "team-a"}, hook)
    assert spec.storage_path == "s3://bucket/experiments/team-a" and hook.asked == 0


@pytest.mark.parametrize(
    ("team", "error", "words"),
    [
        ("team-a?endpoint_override=evil.example:9000", SpecError, "query string"),
        ("team-a#", SpecError, "fragment"),
        ("../../other-team", SpecError, "'..'"),
        ("a/%2e%2e/b", SpecError, "percent-escape"),
    ],
)
def test_the_operator_refuses_a_templated_tail_that_is_not_plain(team, error, words):
    with pytest.raises(error) as info:
        _build("s3://bucket/experiments/{{ params.team }}", {"team": team})
    assert f"storage_path = 's3://bucket/experiments/{team}'" in str(info.value) and words in str(info.value)


def test_the_operator_refuses_a_fully_templated_path_unless_the_deployment_allows_its_root(monkeypatch):
    hook = NoRayHook(("s3://team-bucket/experiments",))
    with pytest.raises(StorageRootError, match="storage_path = 's3://other-bucket/x': lies under no storage root"):
        _build("{{ params.path }}", {"path": "s3://other-bucket/x"}, hook)
    assert hook.asked == 1
    spec = _build("{{ params.path }}", {"path": "s3://team-bucket/experiments/a"}, hook)
    assert spec.storage_path == "s3://team-bucket/experiments/a"
    monkeypatch.setenv(ROOTS_ENV, "file:///nfs/exps")
    hook = NoRayHook()
    spec = _build("{{ params.path }}", {"path": "/nfs/exps/b"}, hook)
    assert spec.storage_path == "/nfs/exps/b" and hook.asked == 0  # the config's root admitted it first


def test_the_ray_connection_carries_allowed_storage_roots(monkeypatch):
    def endpoint(extra: dict[str, Any]) -> RayEndpoint:
        conn = SimpleNamespace(host="127.0.0.1", port=None, schema=None, password=None)
        return RayEndpoint.from_connection(conn, extra)  # type: ignore[arg-type]

    assert endpoint({}).allowed_storage_roots == ()
    assert endpoint({"allowed_storage_roots": "s3://a/x, gs://b"}).allowed_storage_roots == ("s3://a/x", "gs://b")
    assert endpoint({"allowed_storage_roots": ["s3://a/x"]}).allowed_storage_roots == ("s3://a/x",)
    assert endpoint({"allowed_storage_roots": '["s3://a/x"]'}).allowed_storage_roots == ("s3://a/x",)
    from airflow_tune.exceptions import RayConnectionError

    with pytest.raises(RayConnectionError, match="allowed_storage_roots"):
        endpoint({"allowed_storage_roots": 3})
    extra = {"allowed_storage_roots": ["s3://shared/experiments"]}
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps({"conn_type": "ray", "host": "h", "extra": extra}))
    from airflow_tune.hooks.ray import RayHook

    assert RayHook().allowed_storage_roots == ("s3://shared/experiments",)
    assert list(roots.deployment_roots(lambda: RayHook().allowed_storage_roots)) == ["s3://shared/experiments"]


def test_the_provider_declares_the_option_and_the_connection_field():
    info = get_provider_info()
    fields = info["connection-types"][0]["conn-fields"]
    assert "allowed_storage_roots" in fields and "allowed_code_references" in fields
    assert info["config"]["airflow_tune"]["options"]["allowed_storage_roots"]["default"] == ""


def test_roots_imports_neither_ray_nor_boto3_nor_airflow_at_import():
    import subprocess
    import sys

    code = (
        "import sys; import airflow_tune.trust.roots, airflow_tune.common.spec.naming; "
        "bad = [m for m in ('ray', 'boto3', 'pyarrow', 'airflow') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
