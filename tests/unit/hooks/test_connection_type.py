"""The connection type: airflow-tune registers ``ray_tune`` (astro-provider-ray registers ``ray``), keeps
``ray_default`` as the default id, reads connections of either type, and refuses one written for astro-provider-ray
(a Ray Client ``ray://`` address, or only an ``address`` extra and no host), naming the field and what to write."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_tune.exceptions import RayConnectionError
from airflow_tune.hooks.connection import RayEndpoint
from airflow_tune.hooks.ray import RayHook

TOKEN = "s3cr3t-t0ken-value"


def _set_conn(monkeypatch, conn_id: str, conn_type: str, **fields) -> RayHook:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": conn_type, **fields}))
    return RayHook(ray_conn_id=conn_id)


def _conn(host=None, port=None, schema=None, password=None, conn_id="ray_default"):
    return SimpleNamespace(conn_id=conn_id, host=host, port=port, schema=schema, password=password)


def test_the_hook_registers_ray_tune_and_keeps_ray_default():
    from airflow_tune.hooks.connection import CONN_TYPE, LEGACY_CONN_TYPES

    assert RayHook.conn_type == CONN_TYPE == "ray_tune"
    assert LEGACY_CONN_TYPES == ("ray",)
    assert RayHook.hook_name == "Ray Tune (airflow-tune)"
    assert RayHook.default_conn_name == "ray_default"


def test_the_provider_info_declares_ray_tune_and_not_ray():
    from airflow_tune.get_provider_info import get_provider_info

    [declared] = get_provider_info()["connection-types"]
    assert declared["connection-type"] == "ray_tune"
    assert declared["hook-name"] == "Ray Tune (airflow-tune)"
    assert declared["hook-class-name"] == "airflow_tune.hooks.ray.RayHook"
    # The hook's form methods (Airflow before 3.2) read the same declaration.
    assert RayHook.get_ui_field_behaviour()["relabeling"]["password"] == "Token"
    assert RayHook.get_ui_field_behaviour()["hidden_fields"] == ["login"]


def test_providers_manager_maps_ray_tune_to_our_hook_and_leaves_ray_alone():
    from tests.support.airflow_compat import connection_form, task_runtime_hooks

    hooks = task_runtime_hooks()
    assert hooks["ray_tune"].hook_class_name == "airflow_tune.hooks.ray.RayHook"
    assert hooks["ray_tune"].connection_testable
    ray = hooks.get("ray") if "ray" in hooks else None
    assert ray is None or ray.hook_class_name != "airflow_tune.hooks.ray.RayHook"
    form = connection_form("ray_tune")
    assert form["hook_name"] == "Ray Tune (airflow-tune)"
    assert set(form["extra_fields"]) >= {"dashboard_url", "verify", "headers", "runtime_env"}
    assert form["standard_fields"]["password"]["title"] == "Token"


@pytest.mark.parametrize("conn_type", ["ray_tune", "ray"])
def test_the_hook_reads_a_connection_of_either_type(monkeypatch, conn_type):
    extra = {"dashboard_url": "https://ray.example.com/ray", "headers": {"X-Team": "ml"}, "verify": "false"}
    hook = _set_conn(monkeypatch, "ray_either", conn_type, host="ray-head", port=8300, password=TOKEN, extra=extra)
    endpoint = hook.endpoint
    assert endpoint.url == "http://ray-head:8300"
    assert endpoint.dashboard_url == "https://ray.example.com/ray"
    assert endpoint.headers == {"X-Team": "ml", "Authorization": f"Bearer {TOKEN}"}
    assert endpoint.verify is False


@pytest.mark.parametrize("conn_type", ["ray_tune", "ray"])
def test_the_async_path_reads_a_connection_of_either_type(monkeypatch, conn_type):
    import asyncio

    hook = _set_conn(monkeypatch, "ray_either_async", conn_type, host="http://ray-head:8265")
    assert asyncio.run(hook.aget_endpoint()).url == "http://ray-head:8265"


@pytest.mark.parametrize("prefix", ["extra__ray__", "extra__ray_tune__"])
def test_old_form_field_names_of_either_type_are_read(prefix):
    extra = {f"{prefix}dashboard_url": "http://127.0.0.1:8265", f"{prefix}metadata": '{"team": "ml"}'}
    endpoint = RayEndpoint.from_connection(_conn(host="ray-head"), extra)
    assert endpoint.dashboard_url == "http://127.0.0.1:8265"
    assert endpoint.metadata == {"team": "ml"}


def test_the_default_connection_of_type_ray_as_the_readme_showed_it_still_works(monkeypatch):
    conn = {"conn_type": "ray", "host": "https://ray.example.com", "password": TOKEN}
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps(conn))
    hook = RayHook()
    assert hook.ray_conn_id == "ray_default"
    assert hook.endpoint.url == "https://ray.example.com"


# -- astro-provider-ray's connections -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"address": "http://ray-head:8265"}, ["extra 'address'", "http://ray-head:8265"]),
        ({"extra__ray__address": "http://ray-head:8265"}, ["extra 'address'"]),
        ({"address": "ray://ray-head:10001"}, ["extra 'address'", "Ray Client address", "ray://ray-head:10001"]),
        (
            {"address": "http://ray-head:8265", "kube_config_path": "/k", "namespace": "ray"},
            ["extra 'address'", "kube_config_path", "namespace"],
        ),
        ({"kube_config": "{}", "cluster_context": "prod"}, ["cluster_context", "kube_config"]),
    ],
)
def test_an_astro_connection_with_no_host_is_refused_naming_the_field_and_what_to_write(extra, names):
    with pytest.raises(RayConnectionError) as info:
        RayEndpoint.from_connection(_conn(conn_id="ray_astro"), extra)
    message = str(info.value)
    assert "'ray_astro'" in message
    assert "astro-provider-ray" in message
    for name in names:
        assert name in message, message
    # What to write: the dashboard's URL in the host, and the type to choose.
    assert "host" in message and "http://ray-head:8265" in message and "ray_tune" in message


def test_a_ray_client_address_in_the_host_is_refused_naming_the_dashboard():
    with pytest.raises(RayConnectionError) as info:
        RayEndpoint.from_connection(_conn(host="ray://ray-head:10001", conn_id="ray_astro"), {})
    message = str(info.value)
    assert "host 'ray://ray-head:10001'" in message
    assert "Ray Client address" in message
    assert "dashboard" in message and "http://ray-head:8265" in message


def test_a_ray_client_address_with_credentials_is_never_echoed():
    with pytest.raises(RayConnectionError) as info:
        RayEndpoint.from_connection(_conn(conn_id="c"), {"address": f"ray://user:{TOKEN}@ray-head:10001"})
    assert TOKEN not in str(info.value)
    assert "ray://***@ray-head:10001" in str(info.value)


def test_the_hook_refuses_an_astro_connection_of_type_ray(monkeypatch):
    hook = _set_conn(monkeypatch, "ray_astro", "ray", extra={"address": "ray://ray-head:10001", "namespace": "ray"})
    with pytest.raises(RayConnectionError, match="astro-provider-ray"):
        hook.endpoint  # noqa: B018
    ok, message = hook.test_connection()
    assert not ok and "extra 'address'" in message


def test_a_connection_both_providers_read_works_here_from_its_host():
    # host for airflow-tune, the extra address for astro-provider-ray: the host wins, the address is not read.
    extra = {"address": "http://elsewhere:8265", "namespace": "ray"}
    endpoint = RayEndpoint.from_connection(_conn(host="http://ray-head:8265"), extra)
    assert endpoint.url == "http://ray-head:8265"
