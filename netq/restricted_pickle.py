"""How ``PickleSerializer(restrict=...)`` limits what a pickle may load: the compiled form of
``restrict`` (:class:`Policy`) and the unpickler that asks it before it looks up any global
(:class:`RestrictedUnpickler`). What ``restrict`` accepts is said in :mod:`netq.serializers`.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

__all__ = ("Policy", "RestrictedUnpickler")


class Policy:
    """The compiled form of ``restrict``: exact global names and whole modules."""

    __slots__ = ("names", "modules")

    def __init__(self, names: frozenset[str], modules: tuple[str, ...]) -> None:
        self.names = names
        self.modules = modules

    def owns(self, module: str) -> bool:
        """Whether ``module`` is an allowed module or one of their submodules."""
        for allowed in self.modules:
            if module == allowed or module.startswith(allowed + "."):
                return True
        return False

    def may_import(self, module: str) -> bool:
        # Importing runs the module: pkg.__main__ would run a program. Only the part below
        # the allowed module is checked, so an explicit "__main__" entry still works.
        for allowed in self.modules:
            if module == allowed:
                return True
            if module.startswith(allowed + "."):
                below = module[len(allowed) + 1 :].split(".")
                if not any(_is_dunder(part) for part in below):
                    return True
        return False

    def find_class(self, unpickler: pickle.Unpickler, module: str, name: str) -> Any:
        if f"{module}.{name}" in self.names:
            return pickle.Unpickler.find_class(unpickler, module, name)
        # A dotted name is an attribute path: load.__builtins__.get would reach eval.
        if self.may_import(module) and not any(_is_dunder(part) for part in name.split(".")):
            found = pickle.Unpickler.find_class(unpickler, module, name)
            # A module's namespace also holds what it imported (logging.os.system); only
            # what the allowed modules define themselves is allowed.
            owner = getattr(found, "__module__", None)
            if isinstance(owner, str) and self.owns(owner):
                return found
        raise pickle.UnpicklingError(f"global '{module}.{name}' is forbidden by restrict")


def _is_dunder(part: str) -> bool:
    return len(part) > 4 and part.startswith("__") and part.endswith("__")


class RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: Any, policy: Policy, buffers: list[Any]) -> None:
        # fix_imports=False: the names checked are exactly the names imported.
        super().__init__(io.BytesIO(data), fix_imports=False, buffers=buffers)
        self._policy = policy

    def find_class(self, module: str, name: str) -> Any:
        return self._policy.find_class(self, module, name)
