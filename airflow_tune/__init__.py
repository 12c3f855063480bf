"""airflow-tune: run Ray Tune hyperparameter searches on a Ray cluster from Airflow DAGs."""

# The one version: pyproject.toml reads it (setuptools dynamic), and so does get_provider_info.
__version__ = "0.1.0"
