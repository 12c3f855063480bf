"""The operators' shared steps (the providers' ``utils``): reconciling a try with the jobs before it and waiting for
one (:mod:`.reconcile`, :mod:`.following`), shipping the DAG file's code (:mod:`.shipping`), OpenLineage facets
(:mod:`.lineage`, :mod:`.lineage_parameters`), and the Airflow version flags (:mod:`.version_compat`)."""
