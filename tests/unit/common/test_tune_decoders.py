"""The spec's data grammar refuses every key that any Ray Tune decoder acts on: checked against Ray's own source.

Ray Tune turns JSON into code in two ways: ``eval`` of a ``{"eval": ...}`` node while it resolves a config
(``variant_generator._try_resolve``), and ``cloudpickle.loads`` of a ``{"_type": "CLOUDPICKLE_FALLBACK"}`` node while
its JSON decoder reads experiment state back (``TuneFunctionDecoder.object_hook``, opted in by
``_loads_with_cloudpickle``). These tests read the installed Ray's source: every key a branch tests before it reaches
``eval``/``exec``/an unpickler must be in :data:`~airflow_tune.common.spec.TUNE_DECODER_KEYS`, and the places that
decode JSON or evaluate text are exactly the known ones, so a new marker or a new decoder in a later Ray fails here.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_tune.common.spec import TUNE_DECODER_KEYS, ExperimentSpec, SpecError

pytest.importorskip("ray")

#: The modules whose code reads configs and experiment state (Tune, and Train/AIR, which Tune reuses).
_PACKAGES = ("ray.tune", "ray.train", "ray.air")
#: Where Ray 2.60 decodes JSON with its cloudpickle fallback or evaluates config text: (module, function).
KNOWN_DECODER_SITES = {
    ("ray.tune.search.variant_generator", "_try_resolve"),
    ("ray.tune.utils.serialization", "TuneFunctionDecoder.object_hook"),
    ("ray.tune.utils.serialization", "_loads_with_cloudpickle"),
    ("ray.tune.experiment.trial", "Trial.from_json_state"),
    ("ray.tune.trainable.metadata", "_TrainingRunMetadata.from_json_state"),
    ("ray.tune.analysis.experiment_analysis", "ExperimentAnalysis._load_trials"),
    ("ray.tune.execution.tune_controller", "TuneController.resume"),
}


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for package in _PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root.parent.parent)
            if "tests" in relative.parts or "examples" in relative.parts:
                continue
            module = ".".join(relative.with_suffix("").parts)
            yield module, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method at module or class level, with its qualified name (nested ones are part of it)."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{prefix}{child.name}", child

    yield from walk(tree, "")


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _is_sink(call: ast.Call) -> bool:
    name = _called_name(call)
    if name in ("eval", "exec", "_from_cloudpickle", "_loads_with_cloudpickle"):
        return True
    if name in ("loads", "load") and isinstance(call.func, ast.Attribute):
        owner = call.func.value
        return isinstance(owner, ast.Name) and owner.id in ("cloudpickle", "pickle")
    return False


def _decodes_json(function: ast.AST) -> bool:
    """A function that hands text to eval/exec, is a JSON object hook, or decodes JSON with the cloudpickle opt-in."""
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if name in ("eval", "exec", "_loads_with_cloudpickle", "_from_cloudpickle"):
                return True
            if name == "TuneFunctionDecoder":
                return True
    return getattr(function, "name", "") == "object_hook"


def _guard_keys(function: ast.AST) -> set[str]:
    """String keys tested (``"k" in d``, ``d.get("k")``, ``d["k"]``) by the conditions guarding a sink's branch."""
    keys: set[str] = set()

    def tested(expr: ast.AST) -> None:
        for node in ast.walk(expr):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
                if isinstance(node.left.value, str) and any(isinstance(op, ast.In) for op in node.ops):
                    keys.add(node.left.value)
            elif isinstance(node, ast.Call) and _called_name(node) == "get" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    keys.add(first.value)

    def visit(node: ast.AST, guards: list[ast.AST]) -> None:
        if isinstance(node, ast.If):
            for child in node.body:
                visit(child, [*guards, node.test])
            for child in node.orelse:
                visit(child, guards)
            return
        if isinstance(node, ast.Call) and _is_sink(node):
            for guard in guards:
                tested(guard)
        for child in ast.iter_child_nodes(node):
            visit(child, guards)

    visit(function, [])
    return keys


def _decoder_sites() -> dict[tuple[str, str], set[str]]:
    sites: dict[tuple[str, str], set[str]] = {}
    for module, tree in _sources():
        for qualname, function in _functions(tree):
            if _decodes_json(function):
                sites[(module, qualname)] = _guard_keys(function)
    return sites


def test_every_key_a_tune_decoder_acts_on_is_refused_by_the_spec_grammar():
    sites = _decoder_sites()
    acted_on = set().union(*sites.values())
    # The two markers Ray 2.60 has: its JSON decoder's "_type" and the variant generator's "eval".
    assert {"_type", "eval"} <= acted_on, sites
    assert acted_on <= TUNE_DECODER_KEYS, (
        f"Ray Tune's decoders act on keys the spec grammar lets through: {sorted(acted_on - TUNE_DECODER_KEYS)}; "
        "add them to airflow_tune.common.spec.space.TUNE_DECODER_KEYS"
    )


def test_the_places_that_decode_config_json_are_the_known_ones():
    found = set(_decoder_sites())
    assert found == KNOWN_DECODER_SITES, (
        f"new: {sorted(found - KNOWN_DECODER_SITES)}, gone: {sorted(KNOWN_DECODER_SITES - found)}. A new place "
        "where Ray Tune decodes JSON or evaluates text: read it, add every key it acts on to TUNE_DECODER_KEYS, "
        "then list it here"
    )


BASE = {"trainable": "pkg.mod:train", "name": "exp", "storage_path": "s3://bkt/x", "metric": "loss", "mode": "min"}


@pytest.mark.parametrize("key", sorted(TUNE_DECODER_KEYS))
@pytest.mark.parametrize(
    ("field", "place", "where"),
    [
        ("param_space", lambda node: {"x": {"choice": [1, node]}}, "param_space.x.choice[1]"),
        ("param_space", lambda node: {"x": {"grid_search": [node]}}, "param_space.x.grid_search[0]"),
        ("param_space", lambda node: {"x": {"const": {"deep": [node]}}}, "param_space.x.const.deep[0]"),
        ("param_space", lambda node: {"nested": {"deeper": node}}, "param_space.nested.deeper"),
        ("points_to_evaluate", lambda node: [{"x": node}], "points_to_evaluate[0].x"),
        ("trainable_kwargs", lambda node: {"opts": [node]}, "trainable_kwargs.opts[0]"),
        ("stop", lambda node: {"training_iteration": node}, "stop.training_iteration"),
        (
            "scheduler",
            lambda node: {"name": "pbt", "args": {"hyperparam_mutations": {"x": [1, node]}}},
            "scheduler.args.hyperparam_mutations.x[1]",
        ),
    ],
)
def test_a_decoder_key_is_refused_in_every_data_field_at_any_depth(key, field, place, where):
    node = {key: "00", "value": "80049500"} if key == "_type" else {key: "__import__('os')"}
    data = {**BASE, "param_space": {"x": {"choice": [1]}}, field: place(node)}
    with pytest.raises(SpecError) as raised:
        ExperimentSpec.from_dict(data)
    assert f"{where} = " in str(raised.value) and repr(key) in str(raised.value), str(raised.value)


def test_a_cloudpickle_fallback_node_is_refused_with_other_keys_beside_it():
    node = {"_type": "CLOUDPICKLE_FALLBACK", "value": "80049500", "other": 1}
    with pytest.raises(SpecError, match=r"param_space.x = .*'_type'"):
        ExperimentSpec.from_dict({**BASE, "param_space": {"x": node}})


def test_plain_keys_that_only_look_alike_stay_legal():
    space = {"type": {"choice": ["a", "b"]}, "evaluate": 1, "x_type": {"uniform": [0, 1]}, "eval_every": 2}
    spec = ExperimentSpec.from_dict({**BASE, "param_space": space})
    assert spec.param_space == space
