"""Where promotions go: the S3 registry (:mod:`.s3`), the MLflow Model Registry (:mod:`.mlflow`, with the MLflow
Model it writes, :mod:`.mlflow_model`), the promotion's proven copy of a checkpoint (:mod:`.transfer`), the DAGs a
registry belongs to (:mod:`.owner`), the gates (:mod:`.gates`), where a promotion may write
(:mod:`.promote_written`) and Airflow's record of a promotion, what the deploy helpers verify against
(:mod:`.record`). The promotion operator decides; these read and write."""
