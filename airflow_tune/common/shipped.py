"""What a trainable shipped by value may be besides a function or a class: ``tune.with_parameters(fn, **data)``
taken apart on the Airflow side, for the engine to put back together on the cluster.

Tune's ``with_parameters`` keeps its arguments in a registry that moves them into the object store when Ray starts in
the same process; pickled on the Airflow side and loaded in the job's driver, that registry never flushes and the
trials find nothing. So the operator ships the wrapped trainable and its arguments, and the engine calls
``tune.with_parameters`` again in the driver, as plain Tune does. Imports neither airflow nor ray: pickled by reference
to this module, which every engine job carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["WithParameters"]


@dataclass(frozen=True)
class WithParameters:
    """A trainable and the keyword arguments ``tune.with_parameters`` gives it.

    :param trainable: the function or ``tune.Trainable`` subclass that was wrapped.
    :param parameters: its arguments by name, any picklable values (Tune puts each in the object store).
    """

    trainable: Any
    parameters: dict[str, Any] = field(default_factory=dict)
