"""`TYPE_CHECKING` and `NamedTuple` for the code shipped to nodes, without importing `typing` at run time.

The agent starts a fresh `python3 -S -I` for every call, and importing `typing` there is ~5 ms of its ~50 ms
of CPU (issue 41; benchmarks/startup.py measures the agent's facts call). The shipped modules therefore
import their type names only under `if TYPE_CHECKING:` (this False, which type checkers read as True by its
name), and their records from here: `class Arg(NamedTuple): name: str ...` makes a `collections.namedtuple`
of the class body's annotated fields, their defaults, and its methods, properties and docstring, which is
what `typing.NamedTuple` makes too. mypy checks those classes as `typing.NamedTuple` (imported below under
TYPE_CHECKING). Python 3.8 syntax, like all shipped code.
"""

import collections

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:
    # What the class statement leaves in its namespace besides the fields and what the class defines.
    _MADE_BY_PYTHON = ("__module__", "__qualname__", "__annotations__", "__dict__", "__weakref__")

    class _Maker(type):
        def __new__(mcs, name, bases, namespace):
            if not bases:  # NamedTuple itself
                return super().__new__(mcs, name, bases, namespace)
            if "__classcell__" in namespace:
                raise TypeError(f"{name}: a NamedTuple's methods cannot use super() or __class__")
            fields = list(namespace.get("__annotations__", {}))
            defaults = [namespace[field] for field in fields if field in namespace]
            if fields[len(fields) - len(defaults) :] != [f for f in fields if f in namespace]:
                raise TypeError(f"{name}: a field without a default follows one with a default")
            made = collections.namedtuple(name, fields, defaults=defaults, module=namespace["__module__"])
            made.__qualname__ = namespace["__qualname__"]
            made.__annotations__ = dict(namespace.get("__annotations__", {}))
            for key, value in namespace.items():
                if key not in fields and key not in _MADE_BY_PYTHON:
                    setattr(made, key, value)
            return made

    class NamedTuple(metaclass=_Maker):
        """The base of a shipped record, as `typing.NamedTuple` is written."""
