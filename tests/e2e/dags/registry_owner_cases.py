"""DAGs for the registry ownership and code-position tests (issue 30): a stand-in ``tune`` task hands the run's conf
``result`` to the real PromoteCheckpointOperator.

Team A writes its registries (S3 and MLflow) here. Team B's DAGs try to reach them: through a conf that renders the
whole ``registry_uri``, through a conf that renders a name under team B's own written root (``..``), through a
``gate`` written as a template, and by writing team A's registry literally in another DAG (refused by the owner
record). Team B's legitimate forms: a name under its written root and the threshold from a Param.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, Param, task

from airflow_tune.operators.promote import PromoteCheckpointOperator

TEAM_A_REGISTRY = "s3://airflow-tune/e2e-registry/owner/team-a/digits"
TEAM_A_MODEL = "models:/aft-e2e-owner-team-a"
TEAM_B_ROOT = "s3://airflow-tune/e2e-registry/owner/team-b"


def _promote_dag(dag_id: str, params: dict[str, Any] | None = None, **kwargs: Any) -> DAG:
    with DAG(dag_id, schedule=None, catchup=False, tags=["test"], params=params or {}) as dag:

        @task
        def tune() -> dict:
            from tests.support.sealed import stand_in_tune

            return stand_in_tune()

        PromoteCheckpointOperator(task_id="promote", result=tune(), skip_downstream_if_not_promoted=False, **kwargs)
    return dag


team_a = _promote_dag("aft_owner_team_a", registry_uri=TEAM_A_REGISTRY, gate="always")
team_a_mlflow = _promote_dag("aft_owner_team_a_mlflow", registry_uri=TEAM_A_MODEL, gate="always")

# Team B: the whole registry from the conf (its default is team B's own).
team_b_conf = _promote_dag(
    "aft_owner_team_b_conf",
    params={"registry": Param(f"{TEAM_B_ROOT}/digits", type="string")},
    registry_uri="{{ params.registry }}",
    gate="always",
)
team_b_conf_mlflow = _promote_dag(
    "aft_owner_team_b_conf_mlflow",
    params={"model": Param("aft-e2e-owner-team-b", type="string")},
    registry_uri="models:/{{ params.model }}",
    gate="always",
)
# Team B: a model name under its written root, the threshold from a Param: the legitimate templated forms.
team_b_rooted = _promote_dag(
    "aft_owner_team_b_rooted",
    params={"model": Param("digits", type="string"), "threshold": Param("0.5", type="string")},
    registry_uri=TEAM_B_ROOT + "/{{ params.model }}",
    gate="threshold",
    threshold="{{ params.threshold }}",
)
# Team B: the gate written as a template (gate is not a template field).
team_b_gate = _promote_dag(
    "aft_owner_team_b_gate",
    params={"gate": Param("always", type="string")},
    registry_uri=TEAM_B_ROOT + "/gated",
    gate="{{ params.gate }}",
)
# Team B writes team A's registries in its own DAG file: the owner records refuse it.
team_b_takes_a = _promote_dag("aft_owner_team_b_takes_a", registry_uri=TEAM_A_REGISTRY, gate="always")
team_b_takes_a_mlflow = _promote_dag("aft_owner_team_b_takes_a_mlflow", registry_uri=TEAM_A_MODEL, gate="always")
