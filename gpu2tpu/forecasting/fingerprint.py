"""A key for "the same forecast as before", computed without JAX, in milliseconds.

The figure cache (`aot.FigureCache`) keys compiles by the lowered program, which is exact but
needs torchax imported and the step traced and lowered: seconds before the first answer. A
forecast asked again (a notebook cell run twice, a script rerun) should answer at once, so a
second key is computed from what the program is made of:

- the model's structure: every module's type, `extra_repr` and plain settings (ints, floats,
  strings, small dataclass-like configs), every parameter and buffer's name, shape, dtype
  and whether it trains, and which parameters are shared;
- the code that runs: the bytecode of every method of the model's classes outside torch,
  of the loss function, and, following the names they use, of the functions and classes of
  your own code that they call (torch's own code is pinned by its version in the key);
- the batch's structure (shapes, dtypes, constants), the optimizer plan, the dtype, the
  target topology, the sharding and search settings, and the versions of torch, jax,
  torchax, optax, libtpu and of each package the model's classes come from.

What it cannot see (a global flag flipped in torch, code reached through `getattr` with a
computed name) is what `cache=False` is for. A miss costs nothing: the forecast then traces,
lowers and looks up the exact key as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

_MAX_REPR = 4096
_MAX_ITEMS = 64
_LIBRARY_ROOTS = ("torch", "jax", "jaxlib", "torchax", "optax", "numpy", "builtins", "typing")


class _Hasher:
    """Feeds a sha256 with the pieces of a forecast, following code into user functions."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self._seen: set[int] = set()
        self.packages: dict[str, str] = {}

    def add(self, *parts: Any) -> None:
        for part in parts:
            self.digest.update(repr(part).encode("utf-8", "replace"))
            self.digest.update(b"\x00")

    # code -----------------------------------------------------------------------------------

    def code(self, code: types.CodeType, globals_: dict[str, Any] | None) -> None:
        self.add(code.co_name, code.co_code, code.co_names, code.co_varnames, code.co_freevars)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self.code(const, globals_)
            else:
                self.add(_plain_repr(const))
        if globals_ is None:
            return
        for name in code.co_names:
            if name in globals_:
                self.value(name, globals_[name])

    def function(self, fn: Any) -> None:
        if id(fn) in self._seen:
            return
        self._seen.add(id(fn))
        if isinstance(fn, types.MethodType):
            self.function(fn.__func__)
            self.value("self", fn.__self__)
            return
        if _is_partial(fn):
            self.function(fn.func)
            self.add(tuple(_plain_repr(a) for a in fn.args))
            self.add(sorted((k, _plain_repr(v)) for k, v in fn.keywords.items()))
            return
        module = getattr(fn, "__module__", None) or ""
        if _is_library(module):
            self.library(module, getattr(fn, "__qualname__", repr(fn)))
            return
        code = getattr(fn, "__code__", None)
        if code is None:
            if isinstance(fn, type):
                self.klass(fn)
            elif hasattr(fn, "__dict__"):  # a callable object: its class and settings
                self.klass(type(fn))
                self.attributes(fn)
            else:
                self.add(getattr(fn, "__qualname__", type(fn).__qualname__))
            return
        self.add(module, getattr(fn, "__qualname__", ""))
        self.code(code, getattr(fn, "__globals__", None))
        self.add(tuple(_plain_repr(d) for d in (fn.__defaults__ or ())))
        for cell in fn.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.value("<closure>", contents)

    def klass(self, cls: type) -> None:
        if id(cls) in self._seen:
            return
        self._seen.add(id(cls))
        module = cls.__module__
        self.add("class", module, cls.__qualname__)
        if _is_library(module):
            self.library(module, cls.__qualname__)
            return
        for base in cls.__mro__[1:]:
            if base is not object:
                self.klass(base)
        for name, member in sorted(vars(cls).items(), key=lambda kv: kv[0]):
            function = getattr(member, "__func__", member)  # staticmethod / classmethod
            if isinstance(member, property):
                for accessor in (member.fget, member.fset):
                    if accessor is not None:
                        self.function(accessor)
            elif inspect.isfunction(function):
                self.add(name)
                self.function(function)
            elif isinstance(member, _PLAIN_TYPES):
                self.add(name, member)

    def library(self, module: str, name: str) -> None:
        root = module.split(".", 1)[0]
        self.add("lib", module, name)
        if root not in self.packages:
            self.packages[root] = _version(root)

    # values ---------------------------------------------------------------------------------

    def value(self, name: str, value: Any) -> None:
        """A global or attribute a piece of code reads."""
        import torch

        if isinstance(value, types.ModuleType):
            self.add(name, "module", value.__name__)
            root = value.__name__.split(".", 1)[0]
            if root not in self.packages:
                self.packages[root] = _version(root)
        elif isinstance(value, torch.Tensor):
            self.add(name, "tensor", tuple(value.shape), str(value.dtype))
        elif isinstance(value, type):
            self.klass(value)
        elif inspect.isfunction(value) or inspect.ismethod(value) or _is_partial(value):
            self.function(value)
        elif callable(value) and not isinstance(value, torch.nn.Module):
            module = getattr(value, "__module__", None) or type(value).__module__
            if _is_library(module):
                self.library(module, getattr(value, "__qualname__", type(value).__qualname__))
            else:
                self.function(value)
        else:
            self.add(name, _plain_repr(value))

    def attributes(self, obj: Any) -> None:
        """Plain settings of an object (a module's `heads = 12`, a config dataclass)."""
        for key, value in sorted(vars(obj).items(), key=lambda kv: kv[0]):
            if key.startswith("_") and key not in ("_forward_hooks", "_forward_pre_hooks"):
                continue
            if key in ("_forward_hooks", "_forward_pre_hooks"):
                for hook in value.values():
                    self.function(hook)
                continue
            if key == "training":
                continue
            self.value(key, value)


_PLAIN_TYPES = (bool, int, float, complex, str, bytes, type(None))


def _plain_repr(value: Any, depth: int = 0) -> str:
    """A stable text for a constant: plain values as they are, containers element-wise (the
    first few), dataclasses and config objects by their fields; anything else by its type."""
    if isinstance(value, _PLAIN_TYPES):
        return repr(value)[:_MAX_REPR]
    if depth > 3:
        return type(value).__qualname__
    if isinstance(value, tuple | list | frozenset | set | dict):
        items = list(value.items()) if isinstance(value, dict) else list(value)
        texts = [
            f"{_plain_repr(k, depth + 1)}: {_plain_repr(v, depth + 1)}"
            if isinstance(value, dict)
            else _plain_repr(k, depth + 1)
            for k, v in (
                items[:_MAX_ITEMS]
                if isinstance(value, dict)
                else [(i, None) for i in items[:_MAX_ITEMS]]
            )
        ]
        if isinstance(value, set | frozenset):
            texts.sort()
        return f"{type(value).__name__}[{len(items)}]({', '.join(texts)})"[:_MAX_REPR]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)]
        inner = ", ".join(f"{k}={_plain_repr(v, depth + 1)}" for k, v in fields[:_MAX_ITEMS])
        return f"{type(value).__qualname__}({inner})"[:_MAX_REPR]
    if type(value).__module__.startswith("torch"):
        text = repr(value)  # torch.dtype, torch.device, torch.Size
        return text[:_MAX_REPR] if " at 0x" not in text else type(value).__qualname__
    if hasattr(value, "__dict__") and not callable(value):
        # A config object (transformers' PretrainedConfig): its plain fields.
        items = sorted((k, v) for k, v in vars(value).items() if not k.startswith("_"))
        inner = ", ".join(f"{k}={_plain_repr(v, depth + 1)}" for k, v in items[:_MAX_ITEMS])
        return f"{type(value).__qualname__}({inner})"[:_MAX_REPR]
    return type(value).__qualname__


def _is_partial(value: Any) -> bool:
    import functools

    return isinstance(value, functools.partial)


def _is_library(module: str) -> bool:
    root = module.split(".", 1)[0]
    if root in _LIBRARY_ROOTS:
        return True
    loaded = sys.modules.get(root)
    path = getattr(loaded, "__file__", None) or ""
    return "site-packages" in path or "dist-packages" in path


def _version(root: str) -> str:
    try:
        return importlib.metadata.version(root)
    except Exception:
        return ""


def recipe_key(
    model: Any,
    example_batch: Any,
    loss_fn: Callable[..., Any] | None,
    settings: dict[str, Any],
) -> str:
    """The quick key of a forecast: model structure and code, loss, batch, and `settings`."""
    import torch

    h = _Hasher()
    shared: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        h.add("module", name, type(module).__module__, type(module).__qualname__)
        h.add(module.extra_repr())
        h.klass(type(module))
        h.attributes(module)
        for pname, param in module.named_parameters(recurse=False, remove_duplicate=False):
            full = f"{name}.{pname}" if name else pname
            first = shared.setdefault(id(param), full)
            h.add("param", full, tuple(param.shape), str(param.dtype), param.requires_grad, first)
        for bname, buffer in module.named_buffers(recurse=False, remove_duplicate=False):
            h.add("buffer", bname, tuple(buffer.shape), str(buffer.dtype))
    h.add("loss")
    if loss_fn is None:
        h.add(None)
    elif isinstance(loss_fn, torch.nn.Module):
        h.klass(type(loss_fn))
        h.attributes(loss_fn)
    else:
        h.function(loss_fn)
    h.add("batch", _batch_repr(example_batch))
    h.add("settings", sorted((k, _plain_repr(v)) for k, v in settings.items()))
    h.add("packages", sorted(h.packages.items()))
    return h.digest.hexdigest()


def _batch_repr(batch: Any) -> str:
    import torch
    from torch.utils import _pytree as pytree

    leaves, spec = pytree.tree_flatten(batch)
    parts = [
        f"T{tuple(leaf.shape)}{leaf.dtype}" if isinstance(leaf, torch.Tensor) else _plain_repr(leaf)
        for leaf in leaves
    ]
    return f"{spec}|{'|'.join(parts)}"
