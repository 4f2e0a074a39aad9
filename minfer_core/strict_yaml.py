"""A YAML reader for configuration files a person writes: no duplicate keys, no anchors or
aliases, a bounded size. Every refusal is a :class:`YamlRefusal` naming the key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

import yaml

#: Policy files are a few KiB; anything near this bound is not a policy.
MAX_BYTES = 256 * 1024


class YamlRefusal(ValueError):
    """``key`` (a dotted path, ``line N`` or ``file``) and the ``problem`` found there."""

    def __init__(self, key: str, problem: str):
        self.key, self.problem = key, problem
        super().__init__(f"{key}: {problem}")


class StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses anchors and aliases while composing (so an alias bomb is never
    expanded) and leaves duplicate keys to :func:`_check_keys`."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            what = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            raise YamlRefusal(f"line {event.start_mark.line + 1}",
                              f"YAML {what}{event.anchor} is not allowed in a policy (write the value out)")
        return super().compose_node(parent, index)


def read_strict(path: Union[str, Path], max_bytes: int = MAX_BYTES) -> Any:
    """The file's one YAML document as Python objects (``None`` when empty).

    Raises :class:`YamlRefusal` for a file over ``max_bytes``, invalid YAML, an anchor or alias,
    or a mapping with a repeated key; :class:`OSError`/:class:`UnicodeDecodeError` as reading does.
    """
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise YamlRefusal("file", f"larger than {max_bytes // 1024} KiB; not a policy file")
    text = data.decode("utf-8")
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_keys(node, "")
        return loader.construct_document(node)
    except YamlRefusal:
        raise
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        raise YamlRefusal(where, f"not valid YAML: {getattr(e, 'problem', None) or e}") from None
    finally:
        loader.dispose()


def _check_keys(node: yaml.Node, path: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
            where = f"{path}.{name}" if path else name
            if name in seen:
                raise YamlRefusal(where, f"key given twice (lines {seen[name]} and {key.start_mark.line + 1}); "
                                         "keep one")
            seen[name] = key.start_mark.line + 1
            _check_keys(value, where)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_keys(item, f"{path}.{i}" if path else str(i))
