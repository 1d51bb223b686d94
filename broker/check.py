"""``persisting-broker check [--repair] --storage-path DIR [--topic NAME]``: verify a store while no broker serves
it (persisting/check/ does the work, topic by topic).

The broker's lock (``broker.lock`` of the storage folder, taken by ``lock_storage``) is taken without waiting,
so a check refuses to run beside a broker and a broker cannot start during a check; each topic's own lock keeps
embedded processes out the same way. Prints each topic's report (what was found, one line per problem naming
the topic and the file) and exits 0 when every topic is well, 1 otherwise (a refusal too).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from persisting.check import check_topic, hold, topic_folders
from persisting.engine import topic_dirname
from persisting.errors import TopicLockedError


def _refuse(text: str) -> int:
    print(f"persisting-broker check: {text}", file=sys.stderr)
    return 1


def run(conf: dict[str, Any], topic: str | None, repair: bool) -> int:
    storage = str(conf["storage_path"])
    if "://" in storage:
        return _refuse(f"{storage} is in an object store; check reads a local storage folder")
    root = Path(storage)
    if not root.is_dir():
        return _refuse(f"{root} is not a folder (pass the broker's --storage-path)")
    try:
        lock = hold(root / "broker.lock")
    except TopicLockedError as exc:
        return _refuse(f"a broker serves {root} ({exc}); stop it first: check reads the store while nothing writes it")
    try:
        folders = [root / topic_dirname(topic)] if topic is not None else topic_folders(root)
        if topic is not None and not folders[0].is_dir():
            return _refuse(f"no topic {topic!r} under {root} (no folder {folders[0].name!r})")
        failing = 0
        for folder in folders:
            try:
                report = check_topic(folder, repair=repair)
            except TopicLockedError as exc:
                print(f"topic {folder.name!r} ({folder}): not checked: {exc}, which has it open; close it first")
                failing += 1
                continue
            print("\n".join(report.lines()), flush=True)
            failing += not report.ok
        verdict = "all well" if not failing else f"{failing} with problems"
        print(f"checked {len(folders)} topic(s) under {root}: {verdict}")
        return 1 if failing else 0
    finally:
        if lock is not None:
            os.close(lock)
