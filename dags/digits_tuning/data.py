"""Fixed splits of scikit-learn's bundled digits: train and validation for tuning, a held-out test set for deploys."""

from __future__ import annotations

from typing import Any


def splits() -> dict[str, Any]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.data / 16.0
    y = digits.target
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    x_train, x_val, y_train, y_val = train_test_split(x_rest, y_rest, test_size=0.25, random_state=1, stratify=y_rest)
    return {
        "train": (x_train, y_train),
        "val": (x_val, y_val),
        "test": (x_test, y_test),
        "classes": sorted(set(int(c) for c in y)),
    }
