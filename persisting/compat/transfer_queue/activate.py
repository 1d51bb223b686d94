"""``persisting-transfer-queue enable|disable|status``: make ``import transfer_queue`` give persisting's layer.

verl imports ``transfer_queue`` at the top of its trainer, replay buffer, agent loop and worker bridge, in the
driver and in every Ray worker, before any plugin of ours could run. So the switch is a file: ``enable`` writes a
small ``transfer_queue`` package (a shim, marked as ours) into this environment's site-packages; every process
started from this environment (Ray workers use the same interpreter) then imports the layer. ``disable`` removes
it. Nothing changes until a user runs ``enable``, and it never shadows a real TransferQueue silently:

- ``enable`` refuses when TransferQueue is installed (or a ``transfer_queue`` package that is not our shim is
  there), naming it and the fix (``pip uninstall TransferQueue``, or another virtual environment).
- the shim warns at import when a real TransferQueue is installed beside it (put on the path another way).

The shim aliases the layer's modules under TransferQueue's names (``transfer_queue``, ``transfer_queue.metadata``,
``transfer_queue.client``, ``transfer_queue.sampler``), so ``from transfer_queue.metadata import BatchMeta`` gives
the same class as ``transfer_queue.BatchMeta``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import sys
import sysconfig
from pathlib import Path

import persisting.compat.transfer_queue as layer

from . import client, interface, metadata, samplers

MARKER = "PERSISTING_TRANSFER_QUEUE_SHIM = True"
DIST_NAME = "TransferQueue"

SHIM = f'''"""persisting's TransferQueue layer under the name transfer_queue.

Written by `persisting-transfer-queue enable`; remove it with `persisting-transfer-queue disable`.
"""

{MARKER}

from persisting.compat.transfer_queue import activate as _activate

_activate.install(__name__)
'''


def install(name: str = "transfer_queue") -> None:
    """Make ``name`` (and TransferQueue's submodule names under it) the layer's modules in ``sys.modules``."""
    warn_if_shadowing()
    sys.modules.update(
        {
            f"{name}.metadata": metadata,
            f"{name}.client": client,
            f"{name}.interface": interface,
            f"{name}.sampler": samplers,
            name: layer,
        }
    )


def real_transfer_queue() -> str | None:
    """Where a real TransferQueue distribution is installed in this environment (None: it is not)."""
    try:
        dist = importlib.metadata.distribution(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        return None
    return f"{DIST_NAME} {dist.version} ({dist.locate_file('transfer_queue')})"


def warn_if_shadowing() -> None:
    real = real_transfer_queue()
    if real is not None:
        import warnings

        warnings.warn(
            f"`import transfer_queue` gives persisting's TransferQueue layer, but {real} is installed too and is "
            "shadowed. Fix: `persisting-transfer-queue disable` to use TransferQueue, or `pip uninstall "
            "TransferQueue` to use persisting",
            RuntimeWarning,
            stacklevel=3,
        )


def shim_dir(site_packages: Path | None = None) -> Path:
    return (site_packages or Path(sysconfig.get_paths()["purelib"])) / "transfer_queue"


def is_shim(path: Path) -> bool:
    init = path / "__init__.py"
    try:
        return MARKER in init.read_text()
    except OSError:
        return False


def write_shim(site_packages: Path) -> Path:
    """The shim package under ``site_packages`` (a folder on ``sys.path``); returns its folder."""
    target = shim_dir(site_packages)
    target.mkdir(parents=True, exist_ok=True)
    (target / "__init__.py").write_text(SHIM)
    return target


def enable(site_packages: Path | None = None) -> str:
    target = shim_dir(site_packages)
    real = real_transfer_queue()
    if real is not None:
        raise SystemExit(
            f"persisting-transfer-queue: {real} is installed in this environment; enabling persisting's layer "
            "would shadow it. Fix: `pip uninstall TransferQueue` first, or enable it in another virtual environment"
        )
    if target.exists() and not is_shim(target):
        raise SystemExit(
            f"persisting-transfer-queue: {target} exists and is not persisting's shim (another transfer_queue "
            "package). Remove it or use another virtual environment"
        )
    write_shim(target.parent)
    return f"enabled: `import transfer_queue` now gives persisting's layer in {sys.prefix} ({target})"


def disable(site_packages: Path | None = None) -> str:
    target = shim_dir(site_packages)
    if not target.exists():
        return "not enabled: nothing to remove"
    if not is_shim(target):
        raise SystemExit(f"persisting-transfer-queue: {target} is not persisting's shim; left as it is")
    shutil.rmtree(target)
    return f"disabled: removed {target}"


def status(site_packages: Path | None = None) -> str:
    target = shim_dir(site_packages)
    real = real_transfer_queue()
    if is_shim(target):
        state = f"enabled ({target})"
        if real is not None:
            state += f"; WARNING: {real} is installed too and is shadowed"
        return state
    return f"not enabled; transfer_queue is {real or 'not installed'}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="persisting-transfer-queue",
        description="Make `import transfer_queue` give persisting's TransferQueue layer in this environment.",
    )
    parser.add_argument("command", choices=["enable", "disable", "status"])
    parser.add_argument("--site-packages", type=Path, default=None, help="default: this interpreter's purelib")
    args = parser.parse_args(argv)
    action = {"enable": enable, "disable": disable, "status": status}[args.command]
    print(action(args.site_packages))


if __name__ == "__main__":
    main()
