"""Airflow discovers the provider through its entry point."""

from __future__ import annotations


def test_providers_manager_lists_airflow_tune():
    from airflow.providers_manager import ProvidersManager

    providers = ProvidersManager().providers
    assert "airflow-tune" in providers
    info = providers["airflow-tune"]
    assert info.version == "0.1.0"
    assert info.data["name"] == "Ray Tune"


def test_provider_info_lists_every_module_and_they_import():
    import importlib

    from airflow_tune.get_provider_info import get_provider_info

    info = get_provider_info()
    assert info["connection-types"][0]["connection-type"] == "ray_tune"
    modules = [
        m
        for kind in ("hooks", "operators", "sensors", "triggers")
        for entry in info[kind]
        for m in entry["python-modules"]
    ]
    assert {
        "airflow_tune.hooks.ray",
        "airflow_tune.operators.tune",
        "airflow_tune.operators.promote",
        "airflow_tune.sensors.tune",
        "airflow_tune.triggers.tune",
    } <= set(modules)
    for name in modules:
        importlib.import_module(name)
    for path in info["extra-links"] + [info["connection-types"][0]["hook-class-name"]]:
        module, _, attr = path.rpartition(".")
        assert getattr(importlib.import_module(module), attr)
