"""The hooks every rule module uses: how a backend is made, expected failures, small helpers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ._support import (
    Backend,
    Row,
)


class ContractBase:
    """Conformance tests for one storage backend. Subclass with a ``Test`` name and set ``backend_class``."""

    backend_class: ClassVar[Callable[..., Any] | None] = None
    durable: ClassVar[bool] = True
    mark_non_durable_for_queue: ClassVar[bool] = False
    expected_failures: ClassVar[Mapping[str, str]] = {}
    timeout_seconds: ClassVar[float] = 60.0

    # -- hooks ----------------------------------------------------------------------------------------------

    def make_backend(self, bucket_id: int, storage_path: str, **kwargs: Any) -> Backend:
        """One backend object; override to pass options. ``kwargs`` holds ``batch_size`` and test extras."""
        factory = type(self).backend_class  # through the class: a plain function stays unbound
        if factory is None:
            raise NotImplementedError(
                f"{type(self).__qualname__} must set backend_class = YourBackend or override make_backend()"
            )
        return factory(bucket_id, storage_path, **kwargs)

    def queue_backend_factory(self) -> Callable[..., Any]:
        """What the Queue end-to-end test passes as ``Queue(..., backend=...)``: ``make_backend`` as a factory."""
        suite = self

        def contract_backend(bucket_id: int, storage_path: str, batch_size: int = 100, **kwargs: Any) -> Backend:
            backend = suite.make_backend(bucket_id, storage_path, batch_size=batch_size, **kwargs)
            if suite.mark_non_durable_for_queue:
                backend.durable = False
            return backend

        return contract_backend

    @pytest.fixture(autouse=True)
    def _apply_expected_failures(self, request: pytest.FixtureRequest) -> None:
        name = getattr(request.node, "originalname", None) or request.node.name
        reason = self.expected_failures.get(name)
        if reason is not None:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))

    def _new(self, path: Path, bucket_id: int = 0, batch_size: int = 100, **kwargs: Any) -> Backend:
        return self.make_backend(bucket_id, str(path), batch_size=batch_size, **kwargs)

    def _require_durable(self) -> None:
        if not self.durable:
            pytest.skip("backend is not durable (durable = False): nothing survives a new backend object")

    async def _put_all(self, backend: Backend, rows: list[Row], chunk: int = 0) -> None:
        """put_batch in chunks (0: one put per row)."""
        if chunk <= 0:
            for row in rows:
                await backend.put(row)
            return
        for start in range(0, len(rows), chunk):
            await backend.put_batch(rows[start : start + chunk])
