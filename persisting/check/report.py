"""What a check found in one topic: facts for the summary, notes, and problems (each one line naming the file),
some of which carry the repair that fixes them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class Finding:
    file: str  # relative to the topic's folder ("" for the topic as a whole)
    text: str
    fix: Callable[[], str] | None = None  # repairs it, returns one line saying what was done
    note: bool = False  # a fact worth saying (nothing to repair)


@dataclass(slots=True)
class TopicReport:
    name: str
    folder: Path
    summary: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # repairs made, one line each
    failed: list[str] = field(default_factory=list)  # repairs that raised

    def problem(self, file: str, text: str, fix: Callable[[], str] | None = None) -> None:
        self.findings.append(Finding(file, text, fix))

    def note(self, file: str, text: str) -> None:
        self.findings.append(Finding(file, text, note=True))

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if not f.note]

    @property
    def ok(self) -> bool:
        return not self.problems and not self.failed

    def lines(self) -> list[str]:
        """The report for a person at a terminal: a header, the summary, then one line per finding that names the
        topic and the file."""
        state = "ok" if self.ok else f"{len(self.problems) + len(self.failed)} problem(s)"
        out = [f"topic {self.name!r} ({self.folder}): {state}"]
        out += [f"    {line}" for line in self.summary]
        out += [f"  repaired  topic {self.name!r}: {line}" for line in self.done]
        out += [f"  PROBLEM   topic {self.name!r}: {line}" for line in self.failed]
        for f in self.findings:
            where = f"{f.file}: " if f.file else ""
            if f.note:
                out.append(f"  note      topic {self.name!r}: {where}{f.text}")
            else:
                hint = "--repair fixes this" if f.fix is not None else "--repair cannot fix this"
                out.append(f"  PROBLEM   topic {self.name!r}: {where}{f.text} ({hint})")
        return out


def spans(values: Iterable[int], shown: int = 8) -> str:
    """Sorted integers as ranges, ``3..7, 9, 12..13`` (the first ``shown`` ranges, then how many more)."""
    runs: list[list[int]] = []
    for v in sorted(set(values)):
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    text = ", ".join(f"{a}..{b}" if b > a else f"{a}" for a, b in runs[:shown])
    return text + (f" and {len(runs) - shown} more ranges" if len(runs) > shown else "")
