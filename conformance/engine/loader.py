"""Importing ``--impl`` targets and selecting the specs they registered."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from conformance.spec import Spec, SpecError, registered

__all__ = ["ImplError", "import_path", "load_impls"]


class ImplError(Exception):
    """An ``--impl`` target could not be imported or registered nothing."""


def _module_name_for_path(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    return f"_conformance_impl_{path.stem}_{digest}"


def import_path(path: str | Path) -> ModuleType:
    """Import a ``.py`` file as the module ``--impl=path`` uses (idempotent); used by repros."""
    resolved = Path(path).expanduser().resolve()
    name = _module_name_for_path(resolved)
    if name in sys.modules:
        return sys.modules[name]
    # Let the file import its siblings, as `python path/to/file.py` would.
    if str(resolved.parent) not in sys.path:
        sys.path.insert(0, str(resolved.parent))
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise ImplError(f"cannot import {str(resolved)!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_target(target: str, search_paths: Sequence[Path]) -> ModuleType:
    """Import one target; return its module."""
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target).expanduser()
        for base in (Path.cwd(), *search_paths):
            if (base / path).is_file():
                path = base / path
                break
        path = path.resolve()
        if not path.is_file():
            raise ImplError(f"--impl={target}: no such file {str(path)!r}")
        return import_path(path)
    top = target.split(".")[0]
    if importlib.util.find_spec(top) is None:
        # Not installed: look where the run is, as pytest's `pythonpath` would (appended, so an
        # installed package of the same name still wins).
        for base in search_paths:
            if (base / top).is_dir() or (base / f"{top}.py").is_file():
                if str(base) not in sys.path:
                    sys.path.append(str(base))
                break
    return importlib.import_module(target)


def _source_prefix(module: ModuleType) -> str | None:
    """What the ``registered_at`` of a spec registered from ``module``'s own source starts with: its
    file (``path:``), or its folder for a package; None for a module without a file."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    real = Path(file).resolve()
    return f"{real.parent}{os.sep}" if hasattr(module, "__path__") else f"{real}:"


def _belongs(spec: Spec, module_name: str, source: str | None) -> bool:
    """Registered from the target module or a submodule, by name or by file: one file imported by
    path and by name registers from one call site, and the registry keeps the latest import's name."""
    if spec.origin == module_name or spec.origin.startswith(module_name + "."):
        return True
    return source is not None and spec.registered_at.startswith(source)


def load_impls(impl: str, *, search_paths: Sequence[Path] = ()) -> list[Spec]:
    """Import every comma-separated target of ``impl``; return the specs each registered.

    Module names that are not importable are also looked up in ``search_paths`` (the directory
    pytest runs in and its rootdir); relative ``.py`` paths are resolved against the current
    directory first, then ``search_paths``.

    A spec belongs to a target when it was registered from the target module or one of its
    submodules (by name, or from their files), or during the target's import. Raises :class:`SpecError` for a bad spec and
    :class:`ImplError` for a target that cannot be imported or registers nothing.
    """
    targets = [t.strip() for t in impl.split(",") if t.strip()]
    if not targets:
        raise ImplError(f"--impl={impl!r} names no module; pass e.g. --impl=mypkg or --impl=path/to/specs.py")
    selected: list[Spec] = []
    for target in targets:
        before = {id(s) for s in registered()}
        try:
            module = _import_target(target, search_paths)
        except (SpecError, ImplError):
            raise
        except ImportError as error:
            raise ImplError(
                f"--impl={target}: cannot import it ({type(error).__name__}: {error}); "
                "pass an importable module name or a path to a .py file"
            ) from error
        except Exception as error:
            raise ImplError(f"--impl={target}: importing it raised {type(error).__name__}: {error}") from error
        except SystemExit as exiting:
            raise ImplError(
                f"--impl={target}: importing it called sys.exit({exiting.code!r}); a module that registers "
                "Functions must not exit at import (guard scripts with `if __name__ == \"__main__\":`)"
            ) from None
        source = _source_prefix(module)
        found = [s for s in registered() if id(s) not in before or _belongs(s, module.__name__, source)]
        if not found:
            raise ImplError(
                f"--impl={target}: importing it registered no Functions; call "
                "conformance.register(MyFunction, inputs=[...], reference=...) at import time"
            )
        for spec in found:
            _select(selected, spec)
    return selected


def _select(selected: list[Spec], spec: Spec) -> None:
    """Add ``spec`` unless already there. One file imported twice (``--impl=ops.py,ops``: as a path
    and as a module) registers again from the same call site, which replaces the earlier spec in
    the registry (see ``register``): it replaces it here too, in place, so it is tested once."""
    for position, kept in enumerate(selected):
        if kept is spec:
            return
        if kept.registered_at and kept.registered_at == spec.registered_at and kept.name == spec.name:
            selected[position] = spec
            return
    selected.append(spec)
