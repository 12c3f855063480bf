"""A Ray Train run inside each Tune trial: the example workload of ``dags/ray_train_in_trial.py``.

Kept light: the DAG file imports this package at parse time; Ray is imported only inside the functions that run on
the cluster.
"""

from __future__ import annotations

import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
