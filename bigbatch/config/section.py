"""The bases of every config section: :class:`Section` (strict, finite, no unknown key) and :class:`PartSection`
(a section that chooses a part from a registry and takes the keys the registered parts add)."""

from __future__ import annotations

import copy
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails

from bigbatch.registry import Registry


def _annotation(field: Any) -> Any:
    """A pydantic field's annotation with the ``Annotated`` metadata pydantic keeps apart (markers, constraints)."""
    return Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, types are not coerced, numbers are finite
    (``.inf``, ``.nan`` and YAML floats too large for a double, such as ``1.0e+400``, are refused)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @classmethod
    def keys(cls, load: bool = True) -> dict[str, Any]:
        """Every key the section takes -> its annotation (``Annotated`` markers included); ``load`` is
        :meth:`PartSection.keys`'."""
        return {name: _annotation(field) for name, field in cls.model_fields.items()}

    def model_dump(self, **options: Any) -> dict[str, Any]:
        """pydantic's dump, each part section's keys in its :attr:`PartSection.layout` (reordered here, in Python,
        not by a pydantic serializer, whose JSON mode makes new key strings: a checkpoint pickles each shared key
        string once, so its bytes stay the same)."""
        return _laid_out(self, super().model_dump(**options))


def registered(registry: Registry) -> AfterValidator:
    """A check that a name is registered in ``registry`` ("unknown optimizer 'x' (expected one of: ...)")."""

    def check(name: str) -> str:
        registry.get(name)
        return name

    return AfterValidator(check)


class PartSection(Section):
    """A section that chooses a part from a registry (``parts``; its ``key`` names the choosing field) and takes
    the fields the registered parts add (``register(..., fields={"root": (str, "x")})``: the key ``root``, typed
    and defaulted as given). Every registered part's fields are in the section, whatever part is chosen, so that
    a written config holds every key; but a part's own key given a value other than its default, when another
    part is chosen, is an error naming the parts that use it (a default is accepted: a config written by an
    earlier bigbatch holds them all). A key neither declared nor registered is an error, as in any section.
    Once the section is valid, the chosen part's ``info["check"](section)`` runs, if it has one.

    The built-in parts' keys are declared with the section as well (:attr:`builtin_keys`, free of torch), so that
    the section's keys are known before any part's module is imported (:meth:`keys` without ``load``: the command
    line checks a config's keys before torch loads); each built-in part registers with its entry there
    (``tests/config/test_part_keys.py`` holds the two the same)."""

    model_config = ConfigDict(extra="allow")  # the parts' fields; any other key is refused below
    parts: ClassVar[Registry]
    builtin_keys: ClassVar[dict[str, dict[str, tuple[Any, Any]]]] = {}
    """The fields each built-in part adds, by its name: ``{part: {key: (type, default)}}``."""
    layout: ClassVar[tuple[str, ...]] = ()
    """The order of the section's keys, declared and added, in a written config and in the lists of its keys;
    keys not named follow, in their own order."""

    @classmethod
    def _in_layout(cls, keys: dict[str, Any]) -> dict[str, Any]:
        """``keys`` in the order of :attr:`layout`, then the others."""
        first = {key: keys[key] for key in cls.layout if key in keys}
        return {**first, **{key: value for key, value in keys.items() if key not in first}}


    @classmethod
    def added_fields(cls, load: bool = True) -> dict[str, tuple[Any, Any]]:
        """The fields the parts add: ``{key: (type, default)}``, the built-in parts' (:attr:`builtin_keys`) first,
        then those only a registered part adds; without ``load``, those of the parts registered so far (the built-in
        parts' modules not imported)."""
        added: dict[str, tuple[Any, Any]] = {}
        for fields in cls.builtin_keys.values():
            added.update(fields)
        added.update(cls.parts.all_fields(load))
        taken = sorted(added.keys() & cls.model_fields.keys())
        if taken:
            raise TypeError(f"{cls.parts.kind} fields {taken} are keys of {cls.__name__} already")
        return added

    @classmethod
    def keys(cls, load: bool = True) -> dict[str, Any]:
        """Every key: the section's own and the parts' (:meth:`added_fields`), in :attr:`layout`."""
        added = {key: annotation for key, (annotation, _) in cls.added_fields(load).items()}
        return cls._in_layout({**super().keys(), **added})

    @classmethod
    def users_of(cls, key: str) -> list[str]:
        """The registered parts that declare the added field ``key``."""
        return [name for name in cls.parts.names() if key in cls.parts.get(name).fields]

    def part(self) -> Any:
        """The registry entry of the chosen part."""
        return self.parts.get(getattr(self, self.parts.key.rpartition(".")[2]))

    @model_validator(mode="wrap")
    @classmethod
    def _with_added_fields(cls, data: Any, handler: Any) -> Any:
        if not isinstance(data, dict):
            return handler(data)
        added = cls.added_fields()
        errors: list[dict[str, Any]] = []
        section = None
        try:
            section = handler({k: v for k, v in data.items() if k in cls.model_fields})
        except ValidationError as e:
            errors += e.errors()
        values = {}
        for key, (annotation, default) in added.items():
            if key not in data:
                values[key] = copy.deepcopy(default)
                continue
            try:
                values[key] = _adapter(annotation).validate_python(data[key])
            except ValidationError as e:
                errors += [{**error, "loc": (key, *error["loc"])} for error in e.errors()]
        errors += [{"type": "extra_forbidden", "loc": (key,), "input": value} for key, value in data.items()
                   if key not in cls.model_fields and key not in added]
        if errors:
            details = [InitErrorDetails(type=e["type"], loc=e["loc"], input=e["input"], ctx=e.get("ctx", {}))
                       for e in errors]
            raise ValidationError.from_exception_data(cls.__name__, details)
        section.__pydantic_extra__.update(values)
        part = section.part()
        for key, (_, default) in added.items():
            if key in data and key not in part.fields and values[key] != default:
                section_name = cls.parts.key.rpartition(".")[0]
                raise ValueError(f"{section_name}.{key}: used by {cls.parts.kind} {one_of(cls.users_of(key))} only, "
                                 f"not by {part.name!r} ({cls.parts.key}); leave it out, or at its default "
                                 f"{default!r}")
        check = part.info.get("check")
        if check is not None:
            check(section)
        return section


def _adapter(annotation: Any) -> TypeAdapter:
    """A validator of one added field, as strict as a section's own fields."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return TypeAdapter(annotation)  # a section brings its own config
    return TypeAdapter(annotation, config=ConfigDict(strict=True, allow_inf_nan=False))


def one_of(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]])) if names else "none registered"



def _laid_out(section: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    """``dumped`` (``section``'s dump) with every part section in it, ``section`` included, in its layout."""
    if isinstance(section, PartSection):
        dumped = section._in_layout(dumped)
    for key, value in dumped.items():
        child = getattr(section, key, None)
        if isinstance(child, BaseModel) and isinstance(value, dict):
            dumped[key] = _laid_out(child, value)
    return dumped
