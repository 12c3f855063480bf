"""The experiment spec, as plain JSON: the one input both sides share.

- :mod:`~airflow_tune.common.spec.space`: the search-space grammar (primitives, their arguments by Tune's names, their
  checks, what Tune would run as code, the import paths a space names), and :mod:`~airflow_tune.common.spec.form_schema`
  its JSON schema for trigger forms;
- :mod:`~airflow_tune.common.spec.tune_objects`: Tune's own sample objects as the JSON form, and what a spec cannot
  carry;
- :mod:`~airflow_tune.common.spec.parts`: scheduler, searcher, resources, checkpoints, failures, each checking itself
  (with :mod:`~airflow_tune.common.spec.arguments`, the arguments Tune's schedulers and searchers take, and
  :mod:`~airflow_tune.common.spec.resources`, the resource names and amounts Ray accepts);
- :mod:`~airflow_tune.common.spec.experiment`: the whole spec and its cross-field checks;
  :mod:`~airflow_tune.common.spec.identity` its identity (fingerprint) and what a restore cannot take;
- :mod:`~airflow_tune.common.spec.naming`: experiment names and storage paths.

Imports neither airflow nor ray.
"""

from airflow_tune.common.spec.arguments import SEARCHER_ARGS
from airflow_tune.common.spec.errors import SpecError
from airflow_tune.common.spec.experiment import (
    BEST_SCOPES,
    ERRORED_TRIAL_POLICIES,
    SPEC_VERSION,
    ExperimentSpec,
    code_references,
)
from airflow_tune.common.spec.form_schema import search_space_schema
from airflow_tune.common.spec.identity import (
    IDENTITY_FIELDS,
    fingerprint_of,
    identity_differences,
    identity_of,
    restore_conflicts,
)
from airflow_tune.common.spec.naming import STORAGE_SCHEMES, experiment_name_for
from airflow_tune.common.spec.parts import (
    PLACEMENT_STRATEGIES,
    SCHEDULER_ALIASES,
    SCHEDULERS,
    SEARCHERS,
    CheckpointSpec,
    FailureSpec,
    ResourcesSpec,
    SchedulerSpec,
    SearchSpec,
    node_pins,
)
from airflow_tune.common.spec.space import (
    IMPORT_PATH,
    PRIMITIVES,
    TUNE_CODE_KEYS,
    TUNE_DECODER_KEYS,
    non_finite_numbers,
    primitive_of,
    tune_code_nodes,
)

__all__ = [
    "BEST_SCOPES",
    "ERRORED_TRIAL_POLICIES",
    "IDENTITY_FIELDS",
    "IMPORT_PATH",
    "PLACEMENT_STRATEGIES",
    "PRIMITIVES",
    "SCHEDULERS",
    "SCHEDULER_ALIASES",
    "SEARCHERS",
    "SEARCHER_ARGS",
    "SPEC_VERSION",
    "STORAGE_SCHEMES",
    "TUNE_CODE_KEYS",
    "TUNE_DECODER_KEYS",
    "CheckpointSpec",
    "ExperimentSpec",
    "FailureSpec",
    "ResourcesSpec",
    "SchedulerSpec",
    "SearchSpec",
    "SpecError",
    "code_references",
    "experiment_name_for",
    "fingerprint_of",
    "identity_differences",
    "restore_conflicts",
    "identity_of",
    "node_pins",
    "non_finite_numbers",
    "primitive_of",
    "search_space_schema",
    "tune_code_nodes",
]
