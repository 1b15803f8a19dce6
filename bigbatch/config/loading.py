"""Loading a config: the source (a YAML file, a file of a registered format such as Darknet's ``.cfg``, or a
built-in recipe), YAML read by a safe loader that bounds alias expansion, ``--set a.b=c`` overrides, validation
into a :class:`RunConfig` (every mistake one :class:`UserError`), and the YAML a run directory keeps."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bigbatch.config.adaptive import advisor_max
from bigbatch.config.files import NotAConfigFile, read_config_bytes
from bigbatch.config.messages import describe_validation_error, dotted
from bigbatch.config.run import RunConfig
from bigbatch.config.unknown_keys import unknown_keys_line
from bigbatch.errors import UserError
from bigbatch.registry import CONFIG_FORMATS, did_you_mean

RECIPES_DIR = Path(__file__).parent.parent / "configs"
YAML_SUFFIXES = (".yaml", ".yml")
"""The built-in recipes (``bigbatch/configs/``)."""

def builtin_recipes() -> list[str]:
    """The recipes in ``bigbatch/configs/``: YAML files, and the Darknet ``.cfg`` files written for bigbatch."""
    return sorted({p.stem for p in [*RECIPES_DIR.glob("*.yaml"), *RECIPES_DIR.glob("*.cfg")]})


MAX_YAML_NODES = 100_000
"""The most nodes a YAML document may hold once its aliases are expanded, each alias counted as the nodes of what it
names. The largest recipe holds a few hundred. PyYAML shares an aliased node rather than copying it, but bigbatch
then copies, validates and walks the values (``apply_overrides``, pydantic, ``flatten``, the report): a "billion
laughs" document (1 KB: nine levels, each a list of ten aliases of the one above) would become 10^9 values
there. Refused past this, before anything is built."""


class YAMLTooLarge(yaml.composer.ComposerError):
    """A document past :data:`MAX_YAML_NODES` once its aliases are expanded, or an alias inside what it names (a
    cycle, which never ends)."""


class DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping that gives one key twice (``problem_mark``: the second; ``first``: the line, from 1, of the first).
    YAML forbids it; PyYAML would keep the last silently (a second ``optim:`` section replacing the first)."""

    def __init__(self, key: Any, first: int, mark: yaml.Mark) -> None:
        super().__init__(None, None, f"key {key!r} given twice", mark)
        self.key, self.first = key, first


FLOAT_TAG = "tag:yaml.org,2002:float"
EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")
"""A float in exponent form as YAML 1.2 and Python write it (``1e-3``, ``5E-4``, ``1.0e300``, ``-1e5``, ``.5e3``),
which PyYAML's YAML 1.1 resolver reads as text (it wants a dot and a signed exponent: ``1.0e-3``). It always holds an
``e``, so it takes nothing from the other resolvers: ints, ``1e``, ``e5``, ``1.2.3`` and the rest read as before."""


def _read_exponent_floats(cls: type) -> None:
    cls.add_implicit_resolver(FLOAT_TAG, EXPONENT_FLOAT, list("-+0123456789."))


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, whose constructors' own errors on a malformed value (``!!int x``, the date
    ``2020-13-45``: a ValueError, IndexError, ...) become a ``ConstructorError`` marked with its line, and which
    counts the nodes as they are composed: each alias adds the (expanded) nodes of what it names; past
    :data:`MAX_YAML_NODES`, or an alias to a node that holds it, is a :class:`YAMLTooLarge`. Floats in exponent form
    are floats (:data:`EXPONENT_FLOAT`); a mapping giving a key twice is a :class:`DuplicateKey`."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.nodes = 0
        self._sizes: dict[int, int] = {}  # id of an anchored node -> its nodes, aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        before = self.nodes
        node = super().compose_node(parent, index)
        if isinstance(event, yaml.AliasEvent):
            size = self._sizes.get(id(node))
            if size is None:  # still being composed: the alias is inside what it names
                raise YAMLTooLarge(None, None, f"the alias *{event.anchor} is inside what it names (a cycle); "
                                   "refused", event.start_mark)
            self.nodes += size
        else:
            self.nodes += 1
            if event.anchor is not None:
                self._sizes[id(node)] = self.nodes - before
        if self.nodes > MAX_YAML_NODES:
            raise YAMLTooLarge(None, None, f"more than {MAX_YAML_NODES:,} YAML nodes once aliases are expanded "
                               '(an alias bomb, "billion laughs"?); refused', event.start_mark)
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, LookupError, AttributeError):
            value = repr(node.value) if isinstance(node, yaml.ScalarNode) else "the value"
            problem = f"{value} is not a valid {node.tag.rpartition(':')[2]}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        """The mapping's node, once no key is given twice among its own, as written (checked here, before the
        constructor's ``flatten_mapping`` puts the keys of a merge ``<<: *base`` among them, which the mapping's own
        may give again: those replace them, as YAML's merge says)."""
        node = super().compose_mapping_node(anchor)
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            try:
                first = seen.get(key)
            except TypeError:  # unhashable: the constructor's own error says so
                continue
            if first is not None:
                raise DuplicateKey(key, first, key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return node


_read_exponent_floats(_Loader)


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, which quotes the text that :class:`_Loader` reads as a float (``'1e3'``), so that what
    it writes reads back the same."""


_read_exponent_floats(_Dumper)


def load_yaml(text: str) -> Any:
    """``text`` read by bigbatch's bounded safe loader (:class:`_Loader`): what every YAML reader of bigbatch
    uses. Raises ``yaml.YAMLError`` (:class:`YAMLTooLarge` past :data:`MAX_YAML_NODES`) and ``RecursionError``."""
    return yaml.load(text, Loader=_Loader)


MAX_CONFIG_BYTES = 1 << 20
"""The largest config file read (1 MiB): a resolved config is a few KB, the largest recipe under 10 KB. A run
directory's ``config.yaml`` (``train --resume``, ``report``) is a file anyone may have handed over."""


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping (:func:`read_config_bytes`: a regular file within :data:`MAX_CONFIG_BYTES`); every mistake
    (not a regular file, too large, not UTF-8, syntax, a malformed value) names the file and line."""
    try:
        raw = read_config_bytes(Path(path), MAX_CONFIG_BYTES)
    except NotAConfigFile as e:
        raise UserError(f"config: {e}; not read") from None
    except OSError as e:
        raise UserError(f"config: cannot read {path}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise UserError(f"config: {path}:{line}: not UTF-8 text (byte {raw[e.start]:#04x})") from None
    try:
        data = load_yaml(text)
    except YAMLTooLarge as e:
        raise UserError(f"config: {path}:{e.problem_mark.line + 1}: {e.problem}") from None
    except DuplicateKey as e:
        raise UserError(f"config: {path}:{e.problem_mark.line + 1}: {e.problem} (also line {e.first})") from None
    except yaml.MarkedYAMLError as e:
        mark, context = e.problem_mark, e.context_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = e.problem
        if e.context:  # what was being read: "while scanning a quoted scalar (line 3): ..."
            line = context.line if context is not None else None
            on = f" (line {line + 1})" if line is not None and line != getattr(mark, "line", None) else ""
            problem = f"{e.context}{on}: {problem}"
        raise UserError(f"config: {where}: invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as e:  # a control character, which YAML does not allow
        line = text.count("\n", 0, e.position) + 1
        raise UserError(f"config: {path}:{line}: invalid YAML: character U+{e.character:04X} is not allowed") from None
    except RecursionError:
        raise UserError(f"config: {path}: invalid YAML: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config: {path}: expected a mapping of keys at the top level")
    return data


def resolve_config_source(source: str) -> tuple[Path, str]:
    """A config argument is a YAML file, a Darknet ``.cfg`` or a built-in recipe name; -> (path, recipe name)."""
    path = Path(source)
    if path.is_file():
        return path, path.stem
    for suffix in (".yaml", ".cfg"):
        builtin = RECIPES_DIR / f"{source}{suffix}"
        if builtin.is_file():
            return builtin, source
    if source and path.exists():  # a folder, a FIFO, a device: there, but no file to read ("" is ".")
        kind = "a folder" if path.is_dir() else "not a regular file"
        raise UserError(f"config: {source} is {kind}; expected a YAML file, a Darknet .cfg or a built-in recipe")
    recipes = builtin_recipes()
    raise UserError(f"config: {source!r} is neither a YAML file, a Darknet .cfg nor a built-in recipe"
                    f"{did_you_mean(source, recipes)} (built-in: {', '.join(recipes)})")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value), the value read as YAML (``3``, ``0.1``, ``true``, ``[a, b]``)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise UserError(f"--set: expected KEY=VALUE with a dotted key, got {text!r}")
    try:
        value = load_yaml(raw) if raw.strip() else None
    except (YAMLTooLarge, DuplicateKey) as e:
        raise UserError(f"--set: {key}: {e.problem}") from None
    except (yaml.YAMLError, RecursionError):  # not YAML: the text itself (``name=2020-13-45``, ``a=[``)
        value = raw
    return key.split("."), value


def override_word(key: str, value: str) -> str:
    """The ``--set`` argument that gives ``key`` the text ``value``, as one shell word to paste: the value
    YAML-quoted where YAML would read it otherwise (``off``, ``123``, ``a #b``), the whole ``shlex``-quoted where the
    shell would split or expand it (a space, ``ü`` is fine). :func:`parse_override` reads it back as ``value``."""
    import json
    import shlex

    try:
        plain = load_yaml(value) == value
    except yaml.YAMLError:
        plain = False
    return shlex.quote(f"{key}={value if plain else json.dumps(value)}")  # escaped: YAML reads back any character


# Keys of which only one may be given; setting one from the command line drops the other (the recipe's), and
# setting both there is refused.
_EXCLUSIVE = {"steps": "epochs", "epochs": "steps"}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    given: set[str] = set()
    for text in overrides:
        keys, value = parse_override(text)
        if len(keys) == 1 and keys[0] in _EXCLUSIVE and value is not None:  # ``epochs=null`` clears, gives none
            if _EXCLUSIVE[keys[0]] in given:  # both on one command line: which one was meant is not known
                raise UserError("steps: give either steps or epochs, not both (both are in --set)")
            given.add(keys[0])
        node = data
        for i, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if child is None:  # an optional section left unset (``data.val: null`` in a run's config.yaml): begun
                child = node[key] = {}
            if not isinstance(child, dict):
                raise UserError(f"{dotted(keys[: i + 1])}: is a value, not a section; cannot set {dotted(keys)}")
            node = child
        node[keys[-1]] = value
        if len(keys) == 1 and keys[0] in _EXCLUSIVE:
            data.pop(_EXCLUSIVE[keys[0]], None)
    return data


INT64_LIMIT = 2**63
"""Every whole number in a config fits a signed 64-bit integer (torch, numpy and the data order count in them)."""


def _check_whole_numbers(value: Any, key: str = "") -> None:
    """A whole number beyond 64 bits (``10**400``) is refused naming its key, before any arithmetic on it."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_whole_numbers(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_whole_numbers(v, f"{key}.{i}")
    elif isinstance(value, int) and not isinstance(value, bool) and not -INT64_LIMIT <= value < INT64_LIMIT:
        shown = f"{value:.3g}" if abs(value) < 10**300 else f"a {len(str(abs(value)))}-digit number"
        raise UserError(f"{dotted(key.split('.'))}: {shown} does not fit a 64-bit integer (expected a whole number "
                        f"between -2^63 and 2^63 - 1)")


def validate_config(data: dict[str, Any]) -> RunConfig:
    _check_whole_numbers(data)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise UserError(describe_validation_error(e, RunConfig)) from None


def read_config(source: str, overrides: list[str] | tuple[str, ...] = (), run_dir: Path | None = None
                ) -> dict[str, Any]:
    """A YAML file, a file of a registered format (Darknet ``.cfg``) or a built-in recipe, with the ``--set``
    overrides applied, not validated. A YAML file loads no registry (none is asked for its suffix), so that its
    mistakes (the file, its syntax, an override's) come before torch is imported (``bigbatch/cli.py``).
    ``batch.max: advisor`` is read from the advisor.json beside the file (not a built-in recipe's), else in
    ``run_dir`` (``config/adaptive.py``)."""
    path, recipe = resolve_config_source(source)
    reader = None if path.suffix.lower() in YAML_SUFFIXES else CONFIG_FORMATS.find(path.suffix)
    data = reader.obj(path) if reader is not None else read_yaml(path)
    data.setdefault("name", recipe)
    data = apply_overrides(data, list(overrides))
    places = ([] if path.parent.resolve() == RECIPES_DIR.resolve() else [path.parent]) + (
        [run_dir] if run_dir is not None else [])
    return advisor_max(data, places)


def check_keys(data: dict[str, Any]) -> None:
    """What validation says first of ``data``'s keys, said without loading any part (nor torch): a whole number past
    64 bits, then the unknown keys, at any depth (``config/unknown_keys.py``). The command line asks it before
    anything else; validation checks the rest."""
    _check_whole_numbers(data)
    line = unknown_keys_line(data)
    if line is not None:
        raise UserError(line)


def load_config(source: str, overrides: list[str] | tuple[str, ...] = (), run_dir: Path | None = None) -> RunConfig:
    """Load a YAML file, a file of a registered format (Darknet ``.cfg``) or a built-in recipe, apply ``--set``
    overrides, validate (``run_dir``: where else ``batch.max: advisor`` looks, :func:`read_config`)."""
    return validate_config(read_config(source, overrides, run_dir))


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"a.b.c": value}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_to_yaml(cfg: RunConfig) -> str:
    """The YAML a run directory keeps (``config.yaml``), which :func:`load_yaml` reads back as the same values."""
    return yaml.dump(cfg.model_dump(mode="json"), Dumper=_Dumper, sort_keys=False)
