"""Extra link from a task to its Ray job's page in the Ray dashboard."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import TaskInstanceKey


class RayJobLink(BaseOperatorLink):
    """The "Ray Job" button: the dashboard page of the job the task submitted, stored in XCom at submit time."""

    name = "Ray Job"
    key = "ray_job_url"

    @property
    def xcom_key(self) -> str:
        # The API server reads a serialized link straight from XCom under ``xcom_key``; pointing it at the key written
        # at submit time shows the link while the task still runs or is deferred, not only after it finishes.
        return self.key

    @classmethod
    def persist(cls, context: Context | dict[str, Any], *, job_url: str) -> None:
        """Store the job's dashboard URL for the link, and say it in the task log.

        :param context: the task's context.
        :param job_url: the dashboard page of the job, as a browser opens it (:attr:`RayHook.job_url`).
        """
        context["ti"].xcom_push(key=cls.key, value=job_url)
        task = context.get("task")
        if task is not None:
            # The worker asks for the link again when the task ends; it need not read XCom back for that.
            setattr(task, "ray_job_url", job_url)  # noqa: B010 - any task type, mapped ones too
        getattr(task, "log", log).info("Ray Job page: %s", job_url)

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        """Return the stored job URL, or "" when the task has not submitted a job.

        :param operator: the task.
        :param ti_key: the task instance.
        """
        from airflow.sdk.execution_time.xcom import XCom

        known = getattr(operator, "ray_job_url", None)
        if known:
            return str(known)
        if getattr(operator, "job_id", "unknown") is None:
            # This try submitted no job (e.g. it failed on its arguments): no XCom to look for, nothing to link.
            return ""
        value = XCom.get_value(key=self.key, ti_key=ti_key)
        return value if isinstance(value, str) else ""
