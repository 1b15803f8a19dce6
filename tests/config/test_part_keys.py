"""The built-in parts' keys, declared with their sections (``PartSection.builtin_keys``, read before any part is
imported), are the keys those parts register with: the command line's check of a config's keys
(``config/unknown_keys.py``) then knows the keys validation knows."""

from __future__ import annotations

import pytest

from bigbatch.config import DataConfig, DecayConfig, ModelConfig, OptimConfig, ScheduleConfig

pytestmark = pytest.mark.fast

PART_SECTIONS = [ModelConfig, DataConfig, OptimConfig, ScheduleConfig, DecayConfig]


def built_in_fields(section) -> dict[str, dict]:
    """The fields each built-in part (registered from a module of its registry's ``locations``) registered, by name;
    parts without fields left out."""
    parts = section.parts
    found = {}
    for name in parts.names():
        entry = parts.get(name)
        if getattr(entry.obj, "__module__", None) in parts.locations and entry.fields:
            found[name] = entry.fields
    return found


@pytest.mark.parametrize("section", PART_SECTIONS, ids=lambda section: section.__name__)
def test_the_declared_keys_are_those_the_built_in_parts_register(section):
    assert built_in_fields(section) == section.builtin_keys
    assert list(section.keys(load=False)) == list(section.keys())


def test_a_part_that_registers_an_undeclared_key_is_found():
    """The oracle of the test above: a built-in optimizer's key left out of the declarations is seen."""
    declared = dict(OptimConfig.builtin_keys)
    declared["sgd"] = {key: spec for key, spec in declared["sgd"].items() if key != "nesterov"}
    assert built_in_fields(OptimConfig) != declared
