"""nbclient's `NotebookClient`, with one retry for a kernel that died binding its ports.

jupyter_client picks a kernel's five ports by binding port 0 and letting go; the kernel binds
them a moment later. On a loaded CI machine, with several xdist workers starting kernels at
once, another process can take a port in that gap: the kernel exits with "Address already in
use" and nbclient raises "Kernel died before replying to kernel_info". A fresh kernel manager
picks fresh ports, so the tests start one more kernel rather than fail on a race no user's
notebook meets twice. Any other start failure, and a second death, still fail the test.
"""

from __future__ import annotations

from typing import Any

import nbclient
from jupyter_client.client import KernelClient

__all__ = ["NotebookClient"]

_DIED = "Kernel died before replying to kernel_info"


class NotebookClient(nbclient.NotebookClient):  # type: ignore[misc]
    """`nbclient.NotebookClient` whose kernel start is tried twice when the kernel died."""

    kernel_restarts = 0  # how many kernels died before replying and were replaced
    _start: dict[str, Any] | None = None  # what the kernel was started with (env, cwd)

    async def async_start_new_kernel(self, **kwargs: Any) -> None:
        self._start = kwargs
        await super().async_start_new_kernel(**kwargs)

    async def async_start_new_kernel_client(self) -> KernelClient:
        try:
            return await super().async_start_new_kernel_client()
        except RuntimeError as err:
            if _DIED not in str(err):
                raise
        # nbclient has shut the dead kernel down and dropped its manager
        self.kernel_restarts += 1
        self.km = self.create_kernel_manager()
        await self.async_start_new_kernel(**(self._start or {}))  # the same env and cwd
        return await super().async_start_new_kernel_client()
