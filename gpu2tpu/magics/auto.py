"""`%tpu_auto on`: every cell rewritten and run on the backend, as a normal IPython cell.

The cell stays IPython's own (its display of values, `Out`, `_`, `%%time`, top-level
`await`); four hooks do the rest, and `stop()` removes each:

- an input transformer (after IPython's clean-up of the raw cell, before magics are
  transformed) rewrites the cell with `rewrite_cell`, exactly as `gpu2tpu rewrite` rewrites
  a notebook cell, and says what it could not migrate, one line per problem;
- an AST transformer maps the compiled lines back to the cell as written, registers the cell
  as written for its traceback (IPython registered the rewritten text), and replaces stale
  CUDA device variables the cell reads;
- `pre_run_cell`/`post_run_cell` make the backend's device torch's default around the cell;
- a wrapper of the shell's `showtraceback` adds, before IPython shows an error, a note with
  what a rewritten line really ran and the backend's explanation.
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
import sys
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .cells import (
    PreparedCell,
    add_notes,
    cell_map,
    diff_text,
    leading_blank_lines,
    local_module_lines,
    problem_lines,
    remap_positions,
    replace_stale_devices,
    say,
    show_user_frames,
)

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..backends import Backend
    from ..rewrite.notebooks.notebook import CellRewrite
    from .execution import CellRunner


@functools.cache
def _needs_rewrite() -> re.Pattern[str]:
    """Text at least one of which a cell must hold for the rewrite to change or report it."""
    from ..rewrite.core.model import Options
    from ..rewrite.core.source import prefilter_tokens
    from ..rewrite.notebooks.notebook_shell import NOTEBOOK_TOKENS

    tokens = {t.decode() for t in (*prefilter_tokens(Options()), *NOTEBOOK_TOKENS)}
    return re.compile("|".join(re.escape(t) for t in sorted(tokens)))


@dataclass
class _Pending:
    """The cell being transformed: as written (after IPython's clean-up) and rewritten."""

    number: int
    written: str
    rewrite: CellRewrite | None
    python: str | None = None
    used: bool = False


class _CellPositions(ast.NodeTransformer):
    """The AST transformer auto mode adds to the shell (IPython calls `visit` on each cell's
    tree, after registering the cell's text and before compiling it)."""

    def __init__(self, auto: AutoMode) -> None:
        self.auto = auto

    def visit(self, node: ast.AST) -> ast.AST:
        try:
            self.auto.positions(node)
        except Exception as err:  # IPython drops a transformer that raises: say why, keep going
            print(f"gpu2tpu: auto mode could not map this cell's lines: {err!r}", file=sys.stderr)
        return node


# How many cells `%tpu_auto log` remembers.
_LOG_LIMIT = 256


@dataclass
class _Ran:
    number: int
    written: str
    rewritten: str | None  # None: not looked at (no CUDA token, or a %%tpu cell)
    backend: str


class AutoLog:
    """What auto mode ran for each cell, newest last: `%tpu_auto log` prints it, so the
    silent edits can be read after the fact (`%tpu_auto on --show-diff` prints them live)."""

    def __init__(self) -> None:
        self.cells: list[_Ran] = []

    def add(self, number: int, written: str, rewritten: str | None, backend: str) -> None:
        self.cells = [c for c in self.cells if c.number != number][-_LOG_LIMIT + 1 :]
        self.cells.append(_Ran(number, written, rewritten, backend))

    def text(self) -> str:
        if not self.cells:
            return "gpu2tpu: auto mode has run no cell yet (`%tpu_auto on` starts it)\n"
        changed = [c for c in self.cells if c.rewritten is not None and c.rewritten != c.written]
        out = [
            f"gpu2tpu: auto mode ran {len(self.cells)} cell{'s' * (len(self.cells) != 1)}; "
            f"{len(changed)} rewritten" + (":\n" if changed else ", the others as written\n")
        ]
        for c in changed:
            out.append(diff_text(c.written, c.rewritten or "", f"In[{c.number}]", c.backend))
        same = [f"In[{c.number}]" for c in self.cells if c not in changed]
        if changed and same:
            out.append(f"as written: {', '.join(same)}\n")
        return "".join(out)


class AutoMode:
    """The hooks of `%tpu_auto on` for one shell and backend."""

    def __init__(
        self,
        shell: InteractiveShell,
        runner: CellRunner,
        backend: Backend,
        *,
        show_diff: bool = False,
        log: AutoLog | None = None,
    ) -> None:
        self.shell = shell
        self.runner = runner
        self.backend = backend
        self.show_diff = show_diff
        self.log = log if log is not None else AutoLog()
        self._stack: ExitStack | None = None
        self._depth = 0  # run_cell nesting (%%capture runs its body as a cell)
        self._pending: _Pending | None = None
        self._raw_cell: str | None = None
        self._ast = _CellPositions(self)
        self._showtraceback: Any = None

    # -- input transformers --------------------------------------------------------------------

    def rewrite_lines(self, lines: list[str]) -> list[str]:
        """IPython clean-up transformer: the cell, rewritten."""
        if self._depth:  # a running cell asked for more (%time's argument): already rewritten
            return lines
        text = "".join(lines)
        self._pending = None
        if not text.strip():
            return lines
        number = self.shell.execution_count  # the cell's number: IPython counts it later
        from ..rewrite.notebooks.ipython_syntax import split_cell_magic

        magic = split_cell_magic(text)
        if (magic is not None and magic.name == "tpu") or not _needs_rewrite().search(text):
            self._pending = _Pending(number, text, None)
            return lines
        result = self.runner.rewrite(text, self.backend)
        self._pending = _Pending(number, text, result)  # its problems are said when it runs
        return result.new_source.splitlines(keepends=True)

    rewrite_lines.has_side_effects = True  # type: ignore[attr-defined]  # IPython reads it: check_complete skips it

    def capture_python(self, lines: list[str]) -> list[str]:
        """IPython post-transformer: remember the Python the cell became (it runs as is)."""
        pending = self._pending
        if not self._depth and pending is not None and pending.python is None:
            pending.python = "".join(lines)
        return lines

    # -- the compiled cell -------------------------------------------------------------------------

    def positions(self, tree: ast.AST) -> None:
        """Map the cell's lines to the cell as written and register that text; replace stale
        CUDA device variables the cell reads."""
        pending = self._pending
        if self._depth != 1 or pending is None or pending.used or pending.python is None:
            return
        pending.used = True
        shell = self.shell
        raw = self._raw_cell if self._raw_cell is not None else pending.written
        filename = shell.compile.get_code_name(raw, pending.python, pending.number)
        rewritten = pending.rewrite.new_source if pending.rewrite is not None else pending.written
        top = leading_blank_lines(raw, pending.written)
        if pending.rewrite is not None and pending.rewrite.changed and filename in linecache.cache:
            to_cell = cell_map(pending.written, rewritten, pending.python, top)
            if to_cell is None:
                ast.increment_lineno(tree, top)
            remap_positions(
                cast(ast.Module, tree), to_cell, pending.python.splitlines(), raw.splitlines(), top
            )
            linecache.cache[filename] = (len(raw), None, raw.splitlines(keepends=True), filename)
        say(replace_stale_devices(shell.user_ns, pending.python, self.backend))
        self.runner.remember(
            PreparedCell(
                filename,
                pending.number,
                pending.written,
                rewritten,
                pending.python,
                None,
                None,
                rewrite=pending.rewrite,
                header_lines=top,
            )
        )

    # -- run events --------------------------------------------------------------------------------

    def pre_run_cell(self, info: Any) -> None:
        self._depth += 1
        if self._depth > 1:
            return
        self._raw_cell = getattr(info, "raw_cell", None)
        pending = self._pending
        if pending is not None:  # ipykernel transforms a cell twice: say it once, here
            say(problem_lines(pending.rewrite))
            self.runner.run_imports(pending.rewrite)
            rewritten = pending.rewrite.new_source if pending.rewrite is not None else None
            if not pending.written.lstrip().startswith("%tpu_auto"):  # not `%tpu_auto log`
                self.log.add(pending.number, pending.written, rewritten, self.backend.name)
            if self.show_diff and rewritten is not None and rewritten != pending.written:
                label = f"In[{pending.number}]"
                sys.stdout.write(diff_text(pending.written, rewritten, label, self.backend.name))
        transformed = getattr(info, "transformed_cell", None)  # IPython 8.22+: what compiles
        if self._pending is not None and isinstance(transformed, str):
            self._pending.python = transformed
        if pending is not None and pending.python is not None:
            say(local_module_lines(pending.python, 0, self.runner.modules_said))
        self._close()
        stack = ExitStack()
        stack.enter_context(self.backend.activate())
        self._stack = stack

    def post_run_cell(self, result: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth:
            return
        self._close()
        self._pending = None
        self._raw_cell = None

    def _close(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    # -- errors ------------------------------------------------------------------------------------

    def _wrap_showtraceback(self) -> None:
        shell = self.shell
        original = shell.showtraceback
        runner, backend = self.runner, self.backend

        def showtraceback(exc_tuple: Any = None, *args: Any, **kwargs: Any) -> Any:
            error = exc_tuple[1] if exc_tuple else sys.exc_info()[1]
            if isinstance(error, BaseException):
                cells = runner.recent.values()
                if _passes_through(error, {c.filename for c in cells}):
                    add_notes(error, cells, backend)
                    show_user_frames(error, shell)
            return original(exc_tuple, *args, **kwargs)

        showtraceback.gpu2tpu_original = original  # type: ignore[attr-defined]  # kept on the wrapper, for unload to restore
        self._showtraceback = showtraceback
        self.shell.showtraceback = showtraceback

    def _unwrap_showtraceback(self) -> None:
        wrapper, self._showtraceback = self._showtraceback, None
        if wrapper is not None and self.shell.__dict__.get("showtraceback") is wrapper:
            del self.shell.showtraceback

    # -- on and off --------------------------------------------------------------------------------

    def start(self) -> None:
        shell = self.shell
        shell.input_transformers_cleanup.append(self.rewrite_lines)
        shell.input_transformers_post.append(self.capture_python)
        shell.ast_transformers.append(self._ast)
        shell.events.register("pre_run_cell", self.pre_run_cell)
        shell.events.register("post_run_cell", self.post_run_cell)
        self._wrap_showtraceback()

    def stop(self) -> None:
        shell = self.shell
        for hooks, hook in (
            (shell.input_transformers_cleanup, self.rewrite_lines),
            (shell.input_transformers_post, self.capture_python),
            (shell.ast_transformers, self._ast),
        ):
            if hook in hooks:
                hooks.remove(hook)
        for event, callback in (
            ("pre_run_cell", self.pre_run_cell),
            ("post_run_cell", self.post_run_cell),
        ):
            with suppress(ValueError):
                shell.events.unregister(event, callback)
        self._unwrap_showtraceback()
        self._close()
        self._depth = 0


def _passes_through(error: BaseException, filenames: set[str]) -> bool:
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in filenames:
            return True
        tb = tb.tb_next
    return False
