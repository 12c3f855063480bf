"""Local stack: a Ray head and an S3 endpoint on 127.0.0.1, and an Airflow home, for the demo and the tests."""

from airflow_tune.local.processes import StackError
from airflow_tune.local.stack import LocalStack
from airflow_tune.local.state import StackState, load_state, stop_from_state

__all__ = ["LocalStack", "StackError", "StackState", "load_state", "stop_from_state"]
