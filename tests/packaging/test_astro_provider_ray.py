"""What a user migrating from astro-provider-ray sees with both providers installed.

astro-provider-ray (Astronomer's older Ray provider, PyPI ``astro-provider-ray``) registers the ``ray`` connection type
and the default id ``ray_default``. airflow-tune registers ``ray_tune``, so both types are listed, each with its own
hook and form, and Airflow warns about neither; airflow-tune's hook still reads connections of type ``ray``, refuses
one written for astro-provider-ray (a ``ray://`` Ray Client address, or only an ``address`` extra) naming the field
and what to write, and reads a dashboard-URL connection of either type.

The wheel (built from a clean copy of the tree), astro-provider-ray (the newest that installs) and ``apache-airflow``
at the constraints' release go into a fresh venv with uv, and the questions are asked there in fresh processes from
a fresh AIRFLOW_HOME. As a control, the same venv is asked again with airflow-tune's provider info as it was (type
``ray``): Airflow then warns and gives ``ray`` to one hook, astro-provider-ray's connections losing theirs. About
15 s with uv's cache.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.packaging.test_distributions import REPO, _airflow_release, _clean_copy, _clean_env, _run, _uv

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(300)]

ASTRO = "astro-provider-ray"
OURS = "airflow_tune.hooks.ray.RayHook"

#: Run in the venv: what ProvidersManager registers for ``ray`` and ``ray_tune``, the UI's connection forms, and
#: airflow-tune's hook on three connections. ``--as-before`` first puts back airflow-tune's earlier provider info
#: (type ``ray``, hook name ``Ray``), before Airflow reads it.
ASK = r"""
import json, sys, warnings
if "--as-before" in sys.argv:
    import airflow_tune.get_provider_info as info_module

    current = info_module.get_provider_info

    def as_before():
        info = current()
        info["connection-types"][0].update({"connection-type": "ray", "hook-name": "Ray"})
        return info

    info_module.get_provider_info = as_before
    from airflow_tune.hooks.ray import RayHook

    RayHook.conn_type, RayHook.hook_name = "ray", "Ray"
warnings.filterwarnings("ignore", message=".*ProvidersManager.hooks is deprecated")
from importlib.metadata import version

from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService
from airflow.providers_manager import ProvidersManager

manager = ProvidersManager()
hooks = {}
for conn_type in ("ray", "ray_tune"):
    hook = manager.hooks.get(conn_type)
    hooks[conn_type] = hook and {"class": hook.hook_class_name, "package": hook.package_name, "name": hook.hook_name}
forms = {
    m.connection_type: {"hook_name": m.hook_name, "extra_fields": sorted(m.extra_fields or {})}
    for m in HookMetaService.hook_meta_data()
    if m.connection_type in ("ray", "ray_tune")
}
read = {}
if "--as-before" not in sys.argv:
    from airflow_tune.hooks.ray import RayHook

    for conn_id in ("ray_default", "ray_dashboard", "ray_tune_dashboard"):
        hook = RayHook(ray_conn_id=conn_id)
        try:
            read[conn_id] = {"url": hook.endpoint.url, "dashboard_url": hook.dashboard_url}
        except Exception as exc:
            read[conn_id] = {"error": type(exc).__name__, "message": str(exc), "test": hook.test_connection()}
versions = {name: version(name) for name in ("apache-airflow", "airflow-tune", "astro-provider-ray")}
print("RESULT " + json.dumps({"hooks": hooks, "forms": forms, "read": read, "versions": versions}))
"""

#: The connections a migrating team has: astro-provider-ray's ``ray_default`` (its form keeps only extras: a Ray
#: Client address and Kubernetes settings), and dashboard-URL connections of both types.
CONNECTIONS = {
    "AIRFLOW_CONN_RAY_DEFAULT": {
        "conn_type": "ray",
        "extra": {"address": "ray://ray-head:10001", "namespace": "ray", "verify": False},
    },
    "AIRFLOW_CONN_RAY_DASHBOARD": {"conn_type": "ray", "host": "http://ray-head:8265"},
    "AIRFLOW_CONN_RAY_TUNE_DASHBOARD": {
        "conn_type": "ray_tune",
        "host": "ray-head",
        "port": 8265,
        "extra": {"dashboard_url": "http://127.0.0.1:8265"},
    },
}


@dataclass
class Venv:
    python: Path
    env: dict[str, str]
    work: Path


@pytest.fixture(scope="module")
def venv() -> Iterator[Venv]:
    uv, release = _uv(), _airflow_release()
    with tempfile.TemporaryDirectory(prefix="aft-astro-") as tmp:
        work = Path(tmp)
        source, dist, venv = work / "source", work / "dist", work / "venv"
        source.mkdir()
        _clean_copy(source)
        _run(
            [uv, "build", "-q", "--wheel", "--no-python-downloads", "--python", sys.executable]
            + ["--out-dir", str(dist), str(source)],
            cwd=work,
        )
        [wheel] = sorted(dist.glob("*.whl"))
        _run([uv, "venv", "-q", "--no-python-downloads", "--python", sys.executable, str(venv)], cwd=work)
        python = venv / "bin" / "python"
        install = [
            *(uv, "pip", "install", "-q", "--python", str(python)),
            *("-c", str(REPO / "constraints.txt")),
            f"apache-airflow=={release}",
            ASTRO,  # the newest release that resolves beside this Airflow under its constraints
            str(wheel),
        ]
        done = subprocess.run(install, cwd=work, capture_output=True, text=True, timeout=240)
        if done.returncode != 0 and "No solution found" in done.stderr:
            pytest.skip(
                f"{ASTRO} does not install beside apache-airflow=={release} under constraints.txt "
                f"(uv's resolver): {done.stderr.strip()[-1500:]}"
            )
        if done.returncode != 0:
            pytest.fail(f"uv pip install exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        (work / "airflow-home").mkdir()
        env = _clean_env(work / "airflow-home")
        env.update({name: json.dumps(conn) for name, conn in CONNECTIONS.items()})
        yield Venv(python, env, work)


def _ask(venv: Venv, *args: str) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [str(venv.python), "-c", ASK, *args], cwd=venv.work, env=venv.env, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT ")), output


@pytest.fixture(scope="module")
def now(venv: Venv) -> tuple[dict[str, Any], str]:
    return _ask(venv)


def test_both_types_are_registered_each_to_its_own_providers_hook(now):
    result, _ = now
    print(json.dumps(result["versions"]))
    assert result["hooks"]["ray"] == {"class": "ray_provider.hooks.RayHook", "package": ASTRO, "name": "Ray"}
    assert result["hooks"]["ray_tune"] == {"class": OURS, "package": "airflow-tune", "name": "Ray Tune (airflow-tune)"}


def test_airflow_warns_about_no_connection_type(now):
    _, output = now
    assert "already registered" not in output, output[-4000:]
    assert "Inconsistency" not in output, output[-4000:]


def test_the_ui_offers_both_forms_and_ours_is_under_ray_tune(now):
    result, _ = now
    forms = result["forms"]
    assert set(forms) == {"ray", "ray_tune"}
    assert forms["ray_tune"]["hook_name"] == "Ray Tune (airflow-tune)"
    assert {"dashboard_url", "runtime_env", "allowed_storage_roots"} <= set(forms["ray_tune"]["extra_fields"])
    # The ray form is astro-provider-ray's: none of airflow-tune's fields (on Airflow 3.3 it shows none of its own
    # either: its form widgets import flask_appbuilder, which apache-airflow alone does not install).
    assert not {"dashboard_url", "runtime_env"} & set(forms["ray"]["extra_fields"])


def test_our_hook_refuses_astro_provider_rays_connection_naming_the_field_and_what_to_write(now):
    result, _ = now
    refused = result["read"]["ray_default"]
    assert refused["error"] == "RayConnectionError", refused
    message = refused["message"]
    assert "'ray_default' has no host" in message
    assert "extra 'address' = 'ray://ray-head:10001' is a Ray Client address" in message
    assert "'namespace'" in message and "astro-provider-ray" in message
    assert "write the Ray dashboard's URL in the connection's host (e.g. http://ray-head:8265" in message
    assert "'ray_tune'" in message and "ray_conn_id" in message
    assert refused["test"] == [False, message]  # the UI's Test button says the same


def test_our_hook_reads_dashboard_url_connections_of_either_type(now):
    result, _ = now
    assert result["read"]["ray_dashboard"] == {"url": "http://ray-head:8265", "dashboard_url": "http://ray-head:8265"}
    assert result["read"]["ray_tune_dashboard"] == {
        "url": "http://ray-head:8265",
        "dashboard_url": "http://127.0.0.1:8265",
    }


def test_control_with_the_earlier_ray_type_airflow_warns_and_one_hook_takes_ray(venv: Venv):
    """What users saw before: both providers registered ``ray``; Airflow warned and kept one of them."""
    result, output = _ask(venv, "--as-before")
    assert "The connection_type 'ray' has been already registered by provider" in output, output[-4000:]
    assert result["hooks"]["ray_tune"] is None
    assert result["hooks"]["ray"]["class"] in {OURS, "ray_provider.hooks.RayHook"}
