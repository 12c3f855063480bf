"""airflow-tune: run Ray Tune hyperparameter searches on a Ray cluster from Airflow DAGs."""

__version__ = "0.1.0"
