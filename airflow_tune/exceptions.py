"""Errors raised by airflow-tune. All derive from :class:`AirflowTuneException`, an ``AirflowException``."""

from __future__ import annotations

from airflow.exceptions import AirflowException


class AirflowTuneException(AirflowException):
    """Base class of every error airflow-tune raises."""


class RayConnectionError(AirflowTuneException):
    """The Ray dashboard could not be reached, or it rejected the credentials."""


class RayDashboardUnavailable(RayConnectionError):
    """The dashboard did not answer, timed out or answered HTTP 5xx/429: a failure that may pass (retried)."""


class RayJobError(AirflowTuneException):
    """The Ray Jobs API refused a request about a job, or the job does not exist."""


class RayJobNotFoundError(RayJobError):
    """The Ray cluster does not know the job (HTTP 404)."""


class ExperimentConflictError(AirflowTuneException):
    """The experiment name is taken by an experiment with another spec (another run uses the same name)."""


class ExperimentStorageError(AirflowTuneException):
    """The experiment's storage (S3 or another filesystem) could not be read or written."""


class MLflowError(AirflowTuneException):
    """The MLflow tracking server or its Model Registry could not be reached, refused a request, or answered what
    airflow-tune cannot use."""


class PromotionError(AirflowTuneException):
    """The winner could not be promoted into the model registry."""
