"""The package's layout, read from the source with ``ast``: the CLI parses and dispatches (no model-name case, no
function that is not a parser, a command or ``main``), the "EMA or raw weights" rule is written once, and Darknet's
file formats live in one package. Each checker is first run on a small source where it must find something, so that
a checker that finds nothing cannot pass by accident."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "bigbatch"
CLI = PACKAGE / "cli.py"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


# ----------------------------------------------------------------------------- no model-name case in the CLI


def _is_model_name(node: ast.expr) -> bool:
    """``<anything>.model.name`` (``cfg.model.name``, ``state.cfg.model.name``)."""
    return (isinstance(node, ast.Attribute) and node.attr == "name" and isinstance(node.value, ast.Attribute)
            and node.value.attr == "model")


def _is_text(node: ast.expr) -> bool:
    """A string literal, or a tuple, list or set of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and bool(node.elts) and all(map(_is_text, node.elts))


def model_name_cases(tree: ast.AST) -> list[int]:
    """The lines where ``model.name`` is compared with a literal name (``==``, ``!=``, ``in``, ``match``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(map(_is_model_name, operands)) and any(map(_is_text, operands)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Match) and _is_model_name(node.subject):
            lines.append(node.lineno)
    return sorted(lines)


def test_a_model_name_case_is_found():
    source = ('if cfg.model.name == "darknet": pass\n'
              'x = "yolo" != args.cfg.model.name\n'
              'y = cfg.model.name in ("a", "b")\n'
              'match cfg.model.name:\n    case "darknet": pass\n'
              'z = cfg.model.name == other_name\n'  # not a literal: a lookup, allowed
              'w = cfg.data.name == "shapes"\n')  # not the model
    assert model_name_cases(ast.parse(source)) == [1, 2, 3, 4]


def test_the_cli_has_no_model_name_case():
    assert model_name_cases(parse(CLI)) == []


# ----------------------------------------------------------------------------- the CLI parses and dispatches


def argparse_types(tree: ast.Module) -> set[str]:
    """The names given as ``type=`` to an ``add_argument`` call."""
    return {keyword.value.id for node in ast.walk(tree) if isinstance(node, ast.Call)
            for keyword in node.keywords if keyword.arg == "type" and isinstance(keyword.value, ast.Name)}


def logic_in_cli(tree: ast.Module) -> list[str]:
    """What a CLI module defines beyond parsing and dispatching. Allowed at the top level: ``build_parser``,
    ``main``, ``cmd_*`` commands, ``_add_*`` helpers that add arguments to a parser, functions given as an argparse
    ``type=``, and classes that subclass ``argparse.ArgumentParser``; no function defined inside another (a rule
    tucked into a command); and every command reached from ``COMMANDS`` or from another command."""
    found = []
    types = argparse_types(tree)
    commands: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = node.name
            if name.startswith("cmd_"):
                commands.add(name)
            elif not (name in ("build_parser", "main") or name.startswith("_add_") or name in types):
                found.append(f"function {name}")
            found += [f"function {inner.name} inside {name}" for inner in ast.walk(node)
                      if inner is not node and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))]
        elif isinstance(node, ast.ClassDef):
            if not any(ast.unparse(base) in ("argparse.ArgumentParser", "ArgumentParser") for base in node.bases):
                found.append(f"class {node.name}")
    called = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id in commands
              and isinstance(node.ctx, ast.Load)}
    found += [f"command {name} reached from nowhere" for name in sorted(commands - called)]
    return found


def test_logic_in_a_cli_is_found():
    source = ("import argparse\n"
              "class Parser(argparse.ArgumentParser): pass\n"
              "class Rules: pass\n"
              "def count(text): return int(text)\n"
              "def build_parser():\n    p = Parser()\n    p.add_argument('--n', type=count)\n    return p\n"
              "def _add_set_arg(parser): pass\n"
              "def holds_this_run(out_dir, cfg): return True\n"
              "def cmd_train(args):\n    def use_ema(state): return True\n    return 0\n"
              "def cmd_orphan(args): return 0\n"
              "COMMANDS = {'train': cmd_train}\n"
              "def main(argv=None): return COMMANDS['train'](argv)\n")
    assert logic_in_cli(ast.parse(source)) == ["class Rules", "function holds_this_run",
                                               "function use_ema inside cmd_train", "command cmd_orphan reached from "
                                               "nowhere"]


def test_the_cli_only_parses_and_dispatches():
    assert logic_in_cli(parse(CLI)) == []


# ----------------------------------------------------------------------------- the EMA-or-raw rule, once


def _functions(tree: ast.Module, module: str) -> list[tuple[str, ast.AST]]:
    """Every function of ``tree`` by its dotted name (``module.Class.method``, ``module.outer.inner``)."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{prefix}.{child.name}", child))
                visit(child, f"{prefix}.{child.name}")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}")
            else:
                visit(child, prefix)

    visit(tree, module)
    return found


def _reads_ema_evaluate(node: ast.AST) -> bool:
    """Whether ``node`` reads ``<anything>.ema.evaluate`` (the config key) outside a nested function."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # counted as its own function
        if (isinstance(child, ast.Attribute) and child.attr == "evaluate" and isinstance(child.value, ast.Attribute)
                and child.value.attr == "ema"):
            return True
        stack.extend(ast.iter_child_nodes(child))
    return False


def ema_rule_functions(sources: dict[str, ast.Module]) -> list[str]:
    """The functions (of the modules ``sources``, by name) that read ``ema.evaluate``; module-level code as
    ``<module>``."""
    found = []
    for module, tree in sources.items():
        found += [name for name, function in _functions(tree, module) if _reads_ema_evaluate(function)]
        top = ast.Module(body=[n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))],
                         type_ignores=[])
        if _reads_ema_evaluate(top):
            found.append(f"{module}.<module>")
    return sorted(found)


def test_the_ema_rule_is_found_where_it_is_written():
    sources = {"a": ast.parse("def f(state, cfg):\n    return state.get('ema') is not None and cfg.ema.evaluate\n"
                              "class Run:\n    def evaluate(self):\n        if not self.cfg.ema.evaluate: pass\n"),
               "b": ast.parse("USE = cfg.ema.evaluate\ndef g(cfg):\n    return cfg.eval.batch\n")}
    assert ema_rule_functions(sources) == ["a.Run.evaluate", "a.f", "b.<module>"]


def test_the_ema_or_raw_rule_is_one_function():
    sources = {module_name(path): parse(path) for path in sorted(PACKAGE.rglob("*.py"))}
    assert ema_rule_functions(sources) == ["bigbatch.largebatch.ema.ema_counts"]


def test_eval_export_and_the_run_use_that_function():
    """The three places that choose the weights (``bigbatch eval``, ``bigbatch export``, a run's evaluation) call
    the rule (``counted_weights`` is ``ema_counts`` applied to a checkpoint)."""
    users = {"engine/eval_checkpoint.py": "counted_weights", "darknet/export.py": "counted_weights",
             "engine/run.py": "ema_counts"}
    for path, function in users.items():
        tree = parse(PACKAGE / path)
        calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Name)}
        assert function in calls, path
    ema = parse(PACKAGE / "largebatch" / "ema.py")
    counted = next(f for name, f in _functions(ema, "ema") if name == "ema.counted_weights")
    assert "ema_counts" in {n.func.id for n in ast.walk(counted) if isinstance(n, ast.Call)
                            and isinstance(n.func, ast.Name)}


# ----------------------------------------------------------------------------- Darknet in one package


def imported_modules(tree: ast.Module) -> set[str]:
    """Every module named by an import of ``tree`` (inside functions too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def test_darknet_file_formats_live_in_darknet():
    """Darknet's file formats live in ``bigbatch/darknet/``: what reads a ``.cfg`` (as a recipe, and as a network with
    its ``.weights``) and a ``.data`` file or YOLO folder is registered from there; and only the CLI (its ``export``
    command) imports the package: everything else reaches it through the registries, which name it as text."""
    from bigbatch.registry import CONFIG_FORMATS, DATASETS, MODELS

    readers = {"a .cfg recipe": CONFIG_FORMATS.get(".cfg").obj, "a .data file": DATASETS.get("yolo").obj,
               "a .cfg network": MODELS.get("darknet").obj, "a .cfg classifier": MODELS.get("darknet_classifier").obj}
    assert {what: obj.__module__ for what, obj in readers.items()
            if not obj.__module__.startswith("bigbatch.darknet.")} == {}
    darknet = PACKAGE / "darknet"
    outside = [p for p in PACKAGE.rglob("*.py") if darknet not in p.parents]
    importers = {module_name(p) for p in outside if any(m == "bigbatch.darknet" or m.startswith("bigbatch.darknet.")
                                                        for m in imported_modules(parse(p)))}
    assert importers == {"bigbatch.cli"}
