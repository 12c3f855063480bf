"""docker/: the compose stack a team deploys. There is no Docker engine here, so the files are checked as data: the
compose file against the compose-spec schema, and against the code, the constraints and each other."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "docker-compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
# ${NAME} (or ${NAME:-default}) is interpolated by compose; $${NAME} is a literal for the container's shell.
VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|FERNET|_KEY\b|KEY_ID")
# Variables the postgres image documents (https://hub.docker.com/_/postgres), read by its entrypoint.
POSTGRES_IMAGE_VARS = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


def _interpolate(text: str) -> str:
    values = _env_example()
    return VAR.sub(lambda m: values[m.group(1)], text)


def _constraint(name: str) -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        pinned, _, version = line.partition("==")
        if pinned.lower() == name.lower():
            return version
    raise LookupError(f"{name} is not pinned in constraints.txt")


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _from_lines(dockerfile: str) -> list[str]:
    return [line.split()[1] for line in (DOCKER / dockerfile).read_text().splitlines() if line.startswith("FROM ")]


def test_the_compose_file_validates_against_the_compose_spec_schema():
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or "check-jsonschema"
    done = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok -- validation done" in done.stdout


def test_the_stack_has_every_service_the_issue_names(services):
    assert {
        "postgres",
        "airflow-init",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "ray-head",
        "ray-worker-1",
        "ray-worker-2",
        "s3",
        "s3-init",
    } <= set(services)
    airflow = [s for name, s in services.items() if name.startswith("airflow-")]
    assert all(_environment(s)["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor" for s in airflow)
    commands = {
        name: services[name]["command"] for name in services if name.startswith("airflow-") and name != "airflow-init"
    }
    assert commands == {
        "airflow-apiserver": "api-server",
        "airflow-scheduler": "scheduler",
        "airflow-dag-processor": "dag-processor",
        "airflow-triggerer": "triggerer",
    }
    assert "airflow db migrate" in services["airflow-init"]["command"][-1]
    assert "create_bucket" in services["s3-init"]["command"][-1]
    # The head offers no CPUs to trials; the workers join it by its GCS address.
    assert "--num-cpus=0" in services["ray-head"]["command"]
    for worker in ("ray-worker-1", "ray-worker-2"):
        assert "--address=ray-head:6379" in services[worker]["command"]
        assert "--head" not in services[worker]["command"]
    assert "--port=6379" in services["ray-head"]["command"]


def test_every_depends_on_target_exists_and_its_condition_can_be_met(services):
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        for target, spec in depends.items() if isinstance(depends, dict) else ((t, {}) for t in depends):
            assert target in services, f"{name} depends on {target}, which is not a service"
            assert target != name
            condition = spec.get("condition", "service_started")
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} to be healthy; it has no check"
            if condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} is a one-shot step: restart: 'no'"


def test_every_long_running_service_has_a_healthcheck(services):
    for name, service in services.items():
        if service.get("restart") == "no":
            continue
        check = service.get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"


def test_images_are_pinned_and_match_the_constraints(services):
    airflow, ray, moto = _constraint("apache-airflow"), _constraint("ray"), _constraint("moto")
    pinned = re.compile(r"^[\w./-]+:(?!latest\b)[\w.-]*\d[\w.-]*$")
    images = {s["image"] for s in services.values() if "image" in s}
    images |= {ref for dockerfile in ("Dockerfile.airflow", "Dockerfile.ray") for ref in _from_lines(dockerfile)}
    for image in images:
        assert pinned.match(image), f"image {image!r} is not pinned to a version"
        assert "latest" not in image
    # Built images: Airflow and Ray at the versions the project is tested with, Python 3.11 on both sides.
    assert _from_lines("Dockerfile.airflow") == [f"apache/airflow:slim-{airflow}-python3.11"]
    assert _from_lines("Dockerfile.ray") == [f"rayproject/ray:{ray}-py311-cpu"]
    assert f'"apache-airflow=={airflow}"' in (DOCKER / "Dockerfile.airflow").read_text()
    assert "-c /opt/airflow-tune/constraints.txt" in (DOCKER / "Dockerfile.airflow").read_text()
    assert "-c /tmp/airflow-tune/constraints.txt" in (DOCKER / "Dockerfile.ray").read_text()
    requirements = (DOCKER / "requirements-ray.txt").read_text()
    assert f"ray[default,tune]=={ray}\n" in requirements
    assert f"scikit-learn=={_constraint('scikit-learn')}\n" in requirements
    assert not re.search(r"^(apache-airflow|airflow-tune|moto)", requirements, re.M), "the cluster holds neither"
    ray_nodes = [s for name, s in services.items() if name.startswith("ray-")]
    assert {s["image"] for s in ray_nodes} == {f"airflow-tune/ray:{ray}"}
    assert all(s["build"]["dockerfile"] == "docker/Dockerfile.ray" for s in ray_nodes)
    assert services["s3"]["image"] == f"motoserver/moto:{moto}"


def test_environment_variable_names_are_ones_the_code_reads(services):
    from airflow.configuration import conf

    from airflow_tune.hooks.ray import RayHook

    ours = "\n".join(p.read_text() for p in [*REPO.glob("dags/**/*.py"), *REPO.glob("airflow_tune/**/*.py")])
    botocore = "\n".join(p.read_text() for p in Path(__import__("botocore").__file__).parent.glob("*.py"))
    ray_root = Path(__import__("ray").__file__).parent
    for name, service in services.items():
        command = json.dumps(service.get("command", ""))
        for var in _environment(service):
            if var.startswith("AIRFLOW__"):
                section, key = var[len("AIRFLOW__") :].lower().split("__", 1)
                options = conf.configuration_description.get(section, {}).get("options", {})
                assert key in options, f"{name}: Airflow has no option [{section}] {key}"
            elif var.startswith("AIRFLOW_CONN_"):
                assert var[len("AIRFLOW_CONN_") :].lower() == RayHook.default_conn_name, var
            elif var.startswith("AIRFLOW_TUNE_"):
                assert f'"{var}"' in ours, f"{name}: nothing in dags/ or airflow_tune/ reads {var}"
            elif var.startswith("AWS_"):
                assert f"'{var}'" in botocore, f"{name}: boto3 does not read {var}"
            elif var.startswith("RAY_"):
                assert any(var in p.read_text() for p in ray_root.glob("_common/**/*.py")) or any(
                    var in p.read_text() for p in ray_root.glob("_private/**/*.py")
                ), f"{name}: Ray does not read {var}"
            elif var in POSTGRES_IMAGE_VARS:
                assert service["image"].startswith("postgres:"), var
            else:
                assert var in command, f"{name}: {var} is read by nothing (not even the service's own command)"


def test_every_variable_comes_from_the_env_example_and_no_secret_is_committed(services):
    text = COMPOSE.read_text()
    example = _env_example()
    used = set(VAR.findall(text))
    assert used == set(example), f"only in compose: {used - set(example)}, only in .env.example: {set(example) - used}"
    for name, service in services.items():
        for var, value in _environment(service).items():
            secret = SECRET_NAME.search(var) and not var.endswith("_FILE")  # a file's path is not a secret
            credentials_in_url = re.search(r"://[^/@\s]+:[^/@\s]+@", value)
            if secret or credentials_in_url:
                assert "${" in value, f"{name}: {var} must come from docker/.env, not the compose file"
    for var, value in example.items():
        if SECRET_NAME.search(var):
            assert value == "change-me", f".env.example holds a value for the secret {var}"
    assert "docker/.env" in (REPO / ".gitignore").read_text().split(), "docker/.env holds the secrets: never commit it"


def test_one_jwt_secret_is_shared_by_every_airflow_component(services):
    secrets = {
        name: _environment(s).get("AIRFLOW__API_AUTH__JWT_SECRET") for name, s in services.items() if "airflow" in name
    }
    assert set(secrets.values()) == {"${AIRFLOW_JWT_SECRET}"}, secrets
    urls = {
        _environment(s).get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL") for n, s in services.items() if "airflow" in n
    }
    assert urls == {"http://airflow-apiserver:8080/execution/"}


def test_the_ray_connection_parses_with_the_hooks_parser_and_points_at_the_head(services):
    from airflow.sdk import Connection

    from airflow_tune.hooks.ray import RayEndpoint, RayHook

    values = {_environment(s)["AIRFLOW_CONN_RAY_DEFAULT"] for n, s in services.items() if n.startswith("airflow-")}
    [value] = values
    conn = Connection.from_json(_interpolate(value), conn_id=RayHook.default_conn_name)
    assert conn.conn_type == RayHook.conn_type
    endpoint = RayEndpoint.from_connection(conn, conn.extra_dejson)
    head = services["ray-head"]["command"]
    assert f"--dashboard-port={endpoint.url.rsplit(':', 1)[1]}" in head and "--dashboard-host=0.0.0.0" in head
    assert endpoint.url == "http://ray-head:8265"
    # Ray's token auth is on: the connection's password is the token every Ray node runs with, from docker/.env.
    assert json.loads(value)["password"] == "${RAY_AUTH_TOKEN}"
    for name in ("ray-head", "ray-worker-1", "ray-worker-2"):
        env = _environment(services[name])
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == "${RAY_AUTH_TOKEN}", name
    assert "RAY_AUTH_TOKEN" in services["ray-head"]["healthcheck"]["test"][-1]


def test_both_sides_reach_the_same_s3_and_the_example_dags_are_mounted(services):
    endpoint = _interpolate(_environment(services["airflow-scheduler"])["AWS_ENDPOINT_URL"])
    assert endpoint == "http://s3:5000"
    for name in ("ray-head", "ray-worker-1", "ray-worker-2", "airflow-triggerer", "airflow-scheduler", "s3-init"):
        env = _environment(services[name])
        assert env["AWS_ENDPOINT_URL"] == "${S3_ENDPOINT_URL}", name
        assert env["AWS_ACCESS_KEY_ID"] == "${S3_ACCESS_KEY_ID}", name
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        [dags] = [v for v in services[name]["volumes"] if v.endswith(":/opt/airflow/dags:ro")]
        assert (COMPOSE.parent / dags.split(":")[0]).resolve() == REPO / "dags"
    assert (REPO / "dags" / "digits_tune_from_ui.py").exists()
    # The Airflow side and the Ray side share no volume: only the dashboard URL and S3.
    airflow_volumes = {
        v.split(":")[0] for n, s in services.items() if n.startswith("airflow-") for v in s.get("volumes", [])
    }
    ray_volumes = {v.split(":")[0] for n, s in services.items() if n.startswith("ray-") for v in s.get("volumes", [])}
    assert not airflow_volumes & ray_volumes
