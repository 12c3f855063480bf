"""Handwritten-digit classifiers tuned with Ray Tune: the example workload the example DAGs ship to the cluster.

The data is scikit-learn's bundled digits set (1,797 8x8 images), so nothing is downloaded. Kept light: DAG files
import this package at parse time, and scikit-learn is imported only inside the functions that train.
"""

from __future__ import annotations

import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
