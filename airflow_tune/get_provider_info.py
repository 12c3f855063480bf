"""Provider metadata that Airflow's ProvidersManager reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_tune import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-tune",
        "name": "Ray Tune",
        "description": "Run Ray Tune hyperparameter searches on a Ray cluster and hand the winner to deployment tasks.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Ray Tune",
                "external-doc-url": "https://docs.ray.io/en/latest/tune/index.html",
                "tags": ["software"],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": "airflow_tune.hooks.ray.RayHook",
                # Not "ray": astro-provider-ray registers that type too (connections of type ray still work).
                "connection-type": "ray_tune",
                "hook-name": "Ray Tune (airflow-tune)",
                "ui-field-behaviour": {
                    "hidden-fields": ["login"],
                    "relabeling": {"host": "Dashboard host or URL", "schema": "Scheme", "password": "Token"},
                    "placeholders": {
                        "host": "127.0.0.1, or the dashboard's URL such as http://ray-head:8265 (not a ray:// address)",
                        "port": "8265",
                        "schema": "http or https (default http)",
                        "password": "Ray auth token, if the cluster needs one",
                    },
                },
                "conn-fields": {
                    "dashboard_url": {
                        "label": "Dashboard URL (browser)",
                        "description": "The Ray dashboard as a browser opens it, e.g. http://127.0.0.1:8265 or "
                        "https://ray.example.com/ray, when the host is an address only Airflow reaches (a service "
                        "name such as http://ray-head:8265). Used for the Ray Job link, the XCom's dashboard_url and "
                        "the Experiment view; API calls still go to the host. Empty: links use the host.",
                        "schema": {"type": ["string", "null"], "examples": ["http://127.0.0.1:8265"]},
                    },
                    "verify": {
                        "label": "Verify TLS",
                        "description": "true, false, or the path of a CA bundle on the worker and triggerer.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "headers": {
                        "label": "Headers",
                        "description": "JSON object of HTTP headers sent with every request.",
                        "schema": {"type": ["object", "null"]},
                    },
                    "cookies": {
                        "label": "Cookies",
                        "description": "JSON object of cookies sent with every request.",
                        "schema": {"type": ["object", "null"]},
                    },
                    "runtime_env": {
                        "label": "Default runtime_env",
                        "description": "JSON object merged under each job's runtime_env (env_vars merge key by key).",
                        "schema": {"type": ["object", "null"]},
                    },
                    "metadata": {
                        "label": "Default job metadata",
                        "description": "JSON object of string values added to each job's metadata.",
                        "schema": {"type": ["object", "null"]},
                    },
                    "allowed_code_references": {
                        "label": "Allowed code references",
                        "description": "Import-path patterns (e.g. my_models.*:*) that values rendered from Params, "
                        "confs or XComs may name as trainable, factory or sample_from. Comma-separated.",
                        "schema": {"type": ["string", "array", "null"]},
                    },
                    "allowed_storage_roots": {
                        "label": "Allowed storage roots",
                        "description": "Storage URIs (e.g. s3://bucket/experiments) under which a storage_path "
                        "rendered from Params, confs or XComs may lie. Comma-separated or a JSON list.",
                        "schema": {"type": ["string", "array", "null"]},
                    },
                },
            }
        ],
        "hooks": [
            {"integration-name": "Ray Tune", "python-modules": ["airflow_tune.hooks.ray", "airflow_tune.hooks.mlflow"]}
        ],
        "operators": [
            {
                "integration-name": "Ray Tune",
                "python-modules": ["airflow_tune.operators.tune", "airflow_tune.operators.promote"],
            }
        ],
        "sensors": [{"integration-name": "Ray Tune", "python-modules": ["airflow_tune.sensors.tune"]}],
        "triggers": [{"integration-name": "Ray Tune", "python-modules": ["airflow_tune.triggers.tune"]}],
        "extra-links": ["airflow_tune.links.ray.RayJobLink"],
        "config": {
            "airflow_tune": {
                "description": "Settings of the airflow-tune provider (Ray Tune on a Ray cluster).",
                "options": {
                    "allowed_code_references": {
                        "description": "Import paths (fnmatch patterns such as my_models.*:* or pkg.mod:fn, "
                        "comma-separated) that a value rendered from a template, a Param, a trigger conf or an XCom "
                        "may name as a trainable, a scheduler or searcher factory or a sample_from function. Paths "
                        "written in the DAG file need no entry. Empty: rendered values may name no code.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "my_models.*:*, shared.tuning:make_scheduler",
                        "default": "",
                    },
                    "allowed_storage_roots": {
                        "description": "Storage URIs (comma-separated, or a JSON list) under which a storage_path "
                        "rendered from a template, a Param, a trigger conf or an XCom may lie, compared segment by "
                        "segment (same scheme and bucket). A storage path written in the DAG file is its own root "
                        "(with a template, the literal text before it, cut back to the last '/'). Empty: rendered "
                        "storage paths stay under the DAG file's root.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "s3://ml-bucket/experiments, file:///shared/experiments",
                        "default": "",
                    },
                },
            }
        },
    }
