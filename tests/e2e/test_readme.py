"""The docs' "Use it" DAG (docs/operators/ray_tune.rst, the README's before the docs tree), run as a user would after
``eval "$(python -m airflow_tune.local env)"``: the block is taken from the docs page as it is, with only the bucket
names pointed at the local stack."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def readme_use_it_block() -> str:
    """The first python block under "Use it" in the RayTuneOperator page, as a user copies it (dedented)."""
    text = (REPO / "docs" / "operators" / "ray_tune.rst").read_text()
    section = text[text.index("\nUse it\n------\n") :]
    match = re.search(r"\.\. code-block:: python\n\n((?:(?: {3}.*)?\n)+)", section)
    assert match, "no python block under 'Use it'"
    return textwrap.dedent(match.group(1)).rstrip("\n") + "\n"


@pytest.mark.timeout(400)
def test_the_readme_dag_runs_on_the_local_stack(stack, tmp_path):
    prefix = f"readme-{uuid.uuid4().hex[:8]}"
    code = readme_use_it_block()
    assert "trainable=train," in code  # the inline form comes first
    code = code.replace("s3://ml-bucket/experiments", f"s3://{stack.bucket}/{prefix}/experiments")
    code = code.replace("s3://ml-bucket/models/my-model", f"s3://{stack.bucket}/{prefix}/models/my-model")
    code = code.replace(
        'with DAG("retrain", schedule="@weekly", catchup=False):',
        'with DAG("retrain", schedule="@weekly", catchup=False) as dag:',
    )
    code += (
        "\nif __name__ == '__main__':\n"
        "    run = dag.test()\n"
        "    from airflow.utils.session import create_session\n"
        "    with create_session() as session:\n"
        "        tis = run.get_task_instances(session=session)\n"
        "        print('STATES', sorted((ti.task_id, str(ti.state)) for ti in tis))\n"
    )
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "retrain.py").write_text(code)
    env = {**os.environ, **stack.env(), "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
    out = subprocess.run(
        [sys.executable, str(dags / "retrain.py")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=380
    )
    failure = out.stdout[out.stdout.find("Traceback") :][:3000] if "Traceback" in out.stdout else ""
    tail = (failure or out.stdout[-4000:], out.stderr[-4000:])
    assert out.returncode == 0, tail
    states = next(line for line in out.stdout.splitlines() if line.startswith("STATES"))
    # The function trainable saves no checkpoint, so the promotion gate declines and the deploy is skipped.
    assert "('tune', 'success')" in states and "('promote', 'success')" in states, (states, tail[0])
    assert "('deploy', 'skipped')" in states, (states, tail)
