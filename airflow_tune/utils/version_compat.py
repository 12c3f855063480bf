"""Airflow's differences between 3.1, 3.2 and 3.3, in one place (the Airflow side's; the engine has its own).

The version flags follow the providers' ``version_compat.py`` (copied, not imported from common-compat, as the
providers do). Each name below is where that Airflow keeps it; nothing here is missing on an older Airflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING


def get_base_airflow_version_tuple() -> tuple[int, int, int]:
    from airflow import __version__
    from packaging.version import Version

    airflow_version = Version(__version__)
    return airflow_version.major, airflow_version.minor, airflow_version.micro


AIRFLOW_V_3_2_PLUS: bool = get_base_airflow_version_tuple() >= (3, 2, 0)
#: 3.3 calls ``BaseTrigger.on_kill`` when a deferred task is marked failed or cleared; 3.1 and 3.2 only cancel it.
AIRFLOW_V_3_3_PLUS: bool = get_base_airflow_version_tuple() >= (3, 3, 0)

if TYPE_CHECKING or AIRFLOW_V_3_2_PLUS:
    from airflow.sdk import SkipMixin
    from airflow.sdk.exceptions import AirflowSensorTimeout
else:  # 3.1: the task runner still catches airflow.exceptions' class; SkipMixin lives in the standard provider
    from airflow.exceptions import AirflowSensorTimeout
    from airflow.providers.standard.utils.skipmixin import SkipMixin

__all__ = ["AIRFLOW_V_3_2_PLUS", "AIRFLOW_V_3_3_PLUS", "AirflowSensorTimeout", "SkipMixin"]
