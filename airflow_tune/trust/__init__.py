"""The trust rules: what counts as code written in the DAG file (:mod:`.code`, :mod:`.literal_code`), rendered
arguments read as data (:mod:`.rendered`), the storage roots rendered paths must stay under (:mod:`.roots`),
experiments kept disjoint (:mod:`.disjoint`), the proofs a result or a Tune state must carry before it is
believed (:mod:`.proofs`), and Airflow's record of the Ray jobs each task instance submitted, the only jobs those
proofs believe (:mod:`.submitted`). Imports no hook: callers pass what they read through.
"""
