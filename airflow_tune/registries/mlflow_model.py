"""The winner as an MLflow Model: a folder MLflow's own clients load (``mlflow.pyfunc.load_model``, ``mlflow models
serve``, the MLflow runtimes of KServe and Seldon MLServer), built around the best checkpoint.

Layout of a promoted model (``<model>`` is the version's own S3 folder, written by the promote task and never under
the experiment's: ``s3://<bucket>/mlflow-models/<name>/versions/<version>`` for a ``models:/<name>`` registry,
``<registry>/versions/<version>`` for an S3 one)::

    <model>/MLmodel                 the python_function flavor; the artifact "checkpoint" is the folder below
    <model>/python_model.pkl        the loader, pickled by MLflow (cloudpickle)
    <model>/requirements.txt, python_env.yaml, conda.yaml   the environment MLflow records
    <model>/input_example.json, serving_input_example.json  when the DAG gives an input example
    <model>/code/...                the loader's package's Python modules, when the loader is named by import path
    <model>/checkpoint/...          the best checkpoint's files, streamed through the promote task and proven

The loader is code, so it comes from the DAG file only (``model_loader=``, not a template field; one an
``expand()`` maps from an XCom is refused): a ``mlflow.pyfunc.PythonModel`` subclass, whose ``load_context`` reads
``context.artifacts["checkpoint"]``, or a function ``load(checkpoint_dir) -> model`` whose result has ``predict``
(or is callable); each as an object or as an import path ``"package.module:name"``. An object no other process can
import by name (defined in the DAG file) is pickled by value; one named by import path is pickled by reference and
the Python modules of its top-level package travel in the model's ``code/`` folder (:func:`copy_modules`: ``*.py``
files only, never a dotfile such as ``.env``, a dot-folder, ``__pycache__`` or a data file).

The folder is built on the Airflow worker without the checkpoint's bytes (MLflow never runs the loader at save
time here: the requirements are given, not inferred), then its files are uploaded beside the checkpoint's copy.
Its digest (:func:`model_digest`) covers every file: the checkpoint's as the experiment's sealed result records them
(and the copy proved them), the others as written; the registry records it, and :mod:`airflow_tune.checkpoints`
verifies it. ``mlflow`` is imported only inside functions.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_tune.common.spec import IMPORT_PATH

#: The checkpoint inside a model folder: the artifact's name and its path.
CHECKPOINT_ARTIFACT = "checkpoint"
MLMODEL_FILE = "MLmodel"
_TEMPLATE = ("{{", "{%", "{#")


@dataclass(frozen=True)
class LoaderSpec:
    """The ``model_loader`` argument as the DAG file wrote it, checked at parse time (nothing imported).

    :param value: the class or function, or its import path.
    :param source: ``module:qualname``, for messages and the XCom.
    """

    value: Any
    source: str


def is_python_model_class(obj: Any) -> bool:
    """Whether ``obj`` is a subclass of ``mlflow.pyfunc.PythonModel``, told from its bases' names (mlflow is not
    imported at parse time)."""
    return inspect.isclass(obj) and any(
        base.__name__ == "PythonModel" and base.__module__.startswith("mlflow.pyfunc") for base in inspect.getmro(obj)
    )


def loader_spec(value: Any) -> LoaderSpec | None:
    """Check ``model_loader`` as the operator gets it: None, an import path written in the DAG file, a
    ``mlflow.pyfunc.PythonModel`` subclass or a function.

    :raises ValueError: a string that is no import path (or holds a template: a loader is code, never rendered).
    :raises TypeError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, str):
        if any(mark in value for mark in _TEMPLATE):
            raise ValueError(
                f"model_loader = {value[:200]!r}: a loader is code, written in the DAG file; it is not a template "
                "field (a template, a Param, a conf or an XCom never chooses code). Write 'package.module:name'"
            )
        if not IMPORT_PATH.match(value):
            raise ValueError(
                f"model_loader = {value[:200]!r}: give an import path 'package.module:name', a "
                "mlflow.pyfunc.PythonModel subclass, or a function load(checkpoint_dir) -> model"
            )
        return LoaderSpec(value, value)
    if is_python_model_class(value) or inspect.isfunction(value):
        return LoaderSpec(value, f"{value.__module__}:{value.__qualname__}")
    if inspect.isclass(value):
        raise TypeError(
            f"model_loader = {value.__qualname__}: a class must subclass mlflow.pyfunc.PythonModel (its load_context "
            'reads context.artifacts["checkpoint"]); or give a function load(checkpoint_dir) -> model'
        )
    raise TypeError(
        f"model_loader = {type(value).__name__} object: give a mlflow.pyfunc.PythonModel subclass, a function "
        "load(checkpoint_dir) -> model, or an import path 'package.module:name' (a class, not an instance)"
    )


def resolve(spec: LoaderSpec) -> Any:
    """The loader object: ``spec.value`` itself, or what its import path names, defined in that module (a name
    reached through the module, such as an import of another module's function, is refused)."""
    if not isinstance(spec.value, str):
        return spec.value
    module_name, _, attr = spec.value.partition(":")
    if "." in attr or attr.startswith("_"):
        raise ValueError(f"model_loader = {spec.value!r}: name a top-level function or class of the module")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model_loader = {spec.value!r}: cannot import {module_name!r} on this worker: {exc}") from exc
    obj = getattr(module, attr, None)
    if obj is None or getattr(obj, "__module__", None) != module_name:
        raise ValueError(f"model_loader = {spec.value!r}: {module_name} defines no function or class {attr!r}")
    checked = loader_spec(obj)
    assert checked is not None
    return obj


def package_folder(obj: Any) -> str | None:
    """The folder (or single file) of the top-level package ``obj`` is defined in, to travel in the model's
    ``code/`` folder; None when it is installed (site-packages: a requirement names it) or not a file."""
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    top = sys.modules.get((getattr(module, "__name__", "") or "").partition(".")[0])
    path = getattr(top, "__file__", None)
    if not path:
        return None
    if os.path.basename(path) == "__init__.py":
        path = os.path.dirname(path)
    if any(part in ("site-packages", "dist-packages") for part in path.split(os.sep)):
        return None
    return path


def copy_modules(package: str, dest: str) -> list[str]:
    """Copy the Python modules (``*.py``) of the package folder ``package`` into ``dest``, in the same layout, and
    nothing else: no file or folder whose name starts with a dot (``.env``, ``.git/``), no ``__pycache__``, no data
    file (``notes.txt``, a config), no symbolic link. The model's ``code/`` folder is uploaded to storage and read by
    whoever loads the model: only the code its loader imports belongs there; a loader reads its data from the
    checkpoint.

    :return: the copied files, relative to ``package``.
    """
    copied = []
    for root, folders, names in os.walk(package):
        folders[:] = sorted(
            f
            for f in folders
            if not f.startswith(".") and f != "__pycache__" and not os.path.islink(os.path.join(root, f))
        )
        for name in sorted(names):
            path = os.path.join(root, name)
            if name.startswith(".") or not name.endswith(".py") or os.path.islink(path):
                continue
            rel = os.path.relpath(path, package)
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(path, os.path.join(dest, rel))
            copied.append(rel.replace(os.sep, "/"))
    return copied


def _importable(obj: Any) -> bool:
    from airflow_tune.utils.shipping import _importable_by_name

    qualname = getattr(obj, "__qualname__", "")
    module_name = getattr(obj, "__module__", "") or ""
    return bool(module_name) and "<locals>" not in qualname and _importable_by_name(module_name)


@contextlib.contextmanager
def _by_value(obj: Any) -> Iterator[None]:
    """cloudpickle pickles ``obj``'s module by value while the block runs, when no other process can import it by
    name (a DAG file's module)."""
    import cloudpickle

    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    register = module is not None and not _importable(obj)
    if register:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        if register:
            cloudpickle.unregister_pickle_by_value(module)


def example_value(example: Any) -> Any:
    """The input example as MLflow takes it: a list of rows of numbers becomes a 2-D numpy array (a tensor
    signature, ``{"inputs": [[...]]}`` when served); anything else as given."""
    if (
        isinstance(example, (list, tuple))
        and example
        and all(isinstance(row, (list, tuple)) and row for row in example)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for row in example for v in row)
    ):
        import numpy as np

        return np.asarray(example, dtype=float)
    return example


def signature_of(signature: Any, example: Any) -> Any:
    """The model's signature: the one given (a ``ModelSignature``, or its ``to_dict()`` form), else the inputs of
    the input example; None without either."""
    from mlflow.models import ModelSignature, infer_signature

    if isinstance(signature, ModelSignature):
        return signature
    if isinstance(signature, Mapping):
        return ModelSignature.from_dict(dict(signature))
    if signature is not None:
        raise TypeError(f"model_signature = {type(signature).__name__}: give a mlflow ModelSignature or its dict form")
    return infer_signature(example) if example is not None else None


def build(
    folder: str,
    spec: LoaderSpec,
    *,
    checkpoint_uri: str,
    requirements: Sequence[str] = (),
    signature: Any = None,
    input_example: Any = None,
    metadata: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Write the MLflow Model's files (all but the checkpoint's) into the new folder ``folder``.

    :param spec: the loader.
    :param checkpoint_uri: where the checkpoint came from (recorded as the artifact's ``uri``).
    :param requirements: pip requirements beside ``mlflow`` and ``cloudpickle`` (the loader's own: a framework).
    :param signature: a ``ModelSignature`` or its dict form; by default the input example's inputs.
    :param input_example: saved with the model (a list of rows of numbers as a 2-D array).
    :param metadata: recorded in ``MLmodel``'s metadata.
    :return: ``{relative path: content digest}`` of the files written.
    """
    import cloudpickle
    import mlflow
    import mlflow.pyfunc
    import yaml

    from airflow_tune.common.provenance import local_file_digests
    from airflow_tune.registries import pyfunc_wrapper

    loader = resolve(spec)
    example = example_value(input_example)
    code_paths: list[str] = []
    scratch = tempfile.mkdtemp(prefix="aft-model-")
    try:
        if isinstance(spec.value, str):
            package = package_folder(loader)
            if package is not None:
                dest = os.path.join(scratch, "code", os.path.basename(package))
                if os.path.isdir(package):
                    copy_modules(package, dest)
                else:
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    shutil.copy2(package, dest)
                code_paths.append(dest)
        python_model = loader() if inspect.isclass(loader) else pyfunc_wrapper.CheckpointModel(loader)
        placeholder = os.path.join(scratch, CHECKPOINT_ARTIFACT)
        os.makedirs(placeholder)
        pip = [f"mlflow=={mlflow.__version__}", f"cloudpickle=={cloudpickle.__version__}", *requirements]
        with _by_value(loader), _wrapper_by_value():
            mlflow.pyfunc.save_model(
                folder,
                python_model=python_model,
                artifacts={CHECKPOINT_ARTIFACT: placeholder},
                code_paths=code_paths or None,
                pip_requirements=pip,
                signature=signature_of(signature, example),
                input_example=example,
                metadata=dict(metadata or {}) or None,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # The artifact is the folder beside MLmodel that the checkpoint's objects are copied to, not a copy of a copy.
    path = os.path.join(folder, MLMODEL_FILE)
    with open(path) as fh:
        conf = yaml.safe_load(fh)
    artifact = conf["flavors"]["python_function"]["artifacts"][CHECKPOINT_ARTIFACT]
    shutil.rmtree(os.path.join(folder, os.path.dirname(artifact["path"]) or artifact["path"]), ignore_errors=True)
    artifact.update({"path": CHECKPOINT_ARTIFACT, "uri": checkpoint_uri})
    with open(path, "w") as fh:
        yaml.safe_dump(conf, fh, default_flow_style=False, sort_keys=False)
    if os.path.exists(os.path.join(folder, CHECKPOINT_ARTIFACT)):
        raise ValueError(f"the model folder holds a {CHECKPOINT_ARTIFACT!r} already; the checkpoint goes there")
    return local_file_digests(folder)


@contextlib.contextmanager
def _wrapper_by_value() -> Iterator[None]:
    """The function loader's wrapper travels by value: a model loads without airflow-tune installed."""
    import cloudpickle

    from airflow_tune.registries import pyfunc_wrapper

    cloudpickle.register_pickle_by_value(pyfunc_wrapper)
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(pyfunc_wrapper)


def model_files(written: Mapping[str, str], checkpoint_files: Mapping[str, str]) -> dict[str, str]:
    """Every file of a model folder: the files :func:`build` wrote and the checkpoint's, under ``checkpoint/``."""
    files = dict(written)
    files.update({f"{CHECKPOINT_ARTIFACT}/{rel}": digest for rel, digest in checkpoint_files.items()})
    return files


def model_digest(files: Mapping[str, str]) -> str:
    """One digest over a model folder's files (as :func:`airflow_tune.common.provenance.files_digest`)."""
    from airflow_tune.common.provenance import files_digest

    return files_digest(files)


def holds_mlflow_model(checkpoint_files: Any) -> bool:
    """Whether a checkpoint is an MLflow Model already (the trainable saved one: ``MLmodel`` at its top), from the
    files its sealed result records."""
    return isinstance(checkpoint_files, Mapping) and MLMODEL_FILE in checkpoint_files


def checkpoint_part(files: Mapping[str, str]) -> dict[str, str]:
    """The checkpoint's own files among a model folder's (relative to the checkpoint)."""
    prefix = f"{CHECKPOINT_ARTIFACT}/"
    return {rel[len(prefix) :]: digest for rel, digest in files.items() if rel.startswith(prefix)}


def upload(s3: Any, folder: str, bucket: str, prefix: str) -> None:
    """Put every file of the local ``folder`` under ``s3://bucket/prefix/``."""
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            with open(path, "rb") as fh:
                s3.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=fh.read())
