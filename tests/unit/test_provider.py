"""Airflow discovers the provider through its entry point."""

from __future__ import annotations


def test_providers_manager_lists_airflow_tune():
    from airflow.providers_manager import ProvidersManager

    providers = ProvidersManager().providers
    assert "airflow-tune" in providers
    info = providers["airflow-tune"]
    assert info.version == "0.1.0"
    assert info.data["name"] == "Ray Tune"
