"""Airflow UI plugins of airflow-tune: the Experiment view of RayTuneOperator task instances."""
