"""Provider metadata that Airflow's ProvidersManager reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-tune",
        "name": "Ray Tune",
        "description": "Run Ray Tune hyperparameter searches on a Ray cluster and hand the winner to deployment tasks.",
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": "Ray Tune",
                "external-doc-url": "https://docs.ray.io/en/latest/tune/index.html",
                "tags": ["software"],
            }
        ],
    }
