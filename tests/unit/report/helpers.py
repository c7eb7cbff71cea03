"""The report tests' kit: runs trees shaped like the controller's, and a page as a tree (the tests query
elements, not the markup's spelling). The browser test reads its pages with the same tree."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from specdeploy.report import pages, reading

HOST = "testbed-1"
STAGES = [("launched", 0.0), ("resolving config", 5.97), ("compiling (torch.compile / autotune)", 19.37),
          ("profiling KV cache", 31.97), ("API server up", 33.22)]  # fmt: skip
REFUSAL = "mean acceptance length fell from 2.40 to 1.10 (-54%; bench_max_regression 10%)"


# --- A page as a tree ------------------------------------------------------------------------

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def all(self, tag: str | None = None, cls: str | None = None, id: str | None = None) -> list[Node]:
        found = []
        for child in self.children:
            if isinstance(child, Node):
                if (
                    (tag is None or child.tag == tag)
                    and (cls is None or set(cls.split()) <= child.classes)
                    and (id is None or child.attrs.get("id") == id)
                ):
                    found.append(child)
                found += child.all(tag, cls, id)
        return found

    def one(self, tag: str | None = None, cls: str | None = None, id: str | None = None) -> Node:
        found = self.all(tag, cls, id)
        assert len(found) == 1, f"{len(found)} <{tag} class={cls} id={id}>"
        return found[0]

    def tooltip(self) -> str:
        return self.one("title").text()


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse_page(markup: str) -> Node:
    builder = _TreeBuilder()
    builder.feed(markup)
    builder.close()
    return builder.root


# --- Runs trees shaped like the controller's -------------------------------------------------


def verdict(status: str = "READY", headline: str | None = None, elapsed_s: float = 33.41) -> dict[str, object]:
    """A verdict.json with the watchdog's field names (as in .state/runs/*/*/verdict.json)."""
    ready = status == "READY"
    stages = STAGES if ready else STAGES[:2]
    return {
        "status": status, "elapsed_s": elapsed_s, "stage": stages[-1][0],
        "headline": headline or ("model=tiny-deepseek-v3 completion=8 tokens acceptance=100.0%" if ready else
                                 "ValueError: User-specified max_model_len (99999) (last stage: resolving config)"),
        "root_cause": None, "exit_code": None if ready else 1, "noise": {"future-warning": 4},
        "noise_catalogue_version": 2, "grammar_version": 3,
        "stages": [{"stage": label, "at_s": at} for label, at in stages],
        "acceptance": {"rate": 1.0, "mean_length": 4.0, "drafts": 2.0, "draft_tokens": 6.0, "accepted_tokens": 6.0}
        if ready else None,
        "completion": {"tokens": 8, "text": "!!!!!!!!"} if ready else None,
        "stack_summary": [], "diagnostics": "/x", "detected_after_exit_s": None, "notes": [],
    }  # fmt: skip


def figures(tps: float, *, ttft: tuple[float, float] = (40.1, 90.2), itl: tuple[float, float] = (10.0, 30.0),
            rate: float | None = 0.71, length: float | None = 2.4,
            positions: tuple[float, ...] = (0.9, 0.7, 0.5)) -> dict[str, object]:  # fmt: skip
    return {"completed": 32, "failed": 0, "duration_s": 12.3, "concurrency": 4, "max_tokens": 64,
            "output_tokens_per_s": tps, "ttft_ms": {"p50": ttft[0], "p99": ttft[1]},
            "itl_ms": {"p50": itl[0], "p99": itl[1]}, "acceptance_rate": rate, "acceptance_length": length,
            "per_position_acceptance": list(positions)}  # fmt: skip


def bench(
    tps: float, previous: dict[str, object] | None = None, problems: tuple[str, ...] = (), **kw: object
) -> dict[str, object]:
    return {"schema": 1, "host": HOST, "time": "2026-12-01T22:10:00Z", "image": "specdeploy/vllm-cpu:17be88d464ba",
            "image_id": "sha256:" + "ab" * 32, "config_digest": "cd" * 8, "hardware": "16 CPU cores",
            "figures": figures(tps, **kw),
            "previous": previous,
            "gate": {"enabled": True, "passed": not problems, "problems": list(problems), "seconds": 14.2}}  # fmt: skip


def write_run(host: Path, run_id: str, verdict_data: object, bench_data: object = None) -> Path:
    run = host / run_id
    run.mkdir(parents=True)
    (run / "verdict.json").write_text(verdict_data if isinstance(verdict_data, str) else json.dumps(verdict_data))
    if bench_data is not None:
        (run / "bench.json").write_text(bench_data if isinstance(bench_data, str) else json.dumps(bench_data))
    return run


def page_of(runs_root: Path, host: str = HOST, last: int = 20) -> Node:
    return parse_page(pages.render_host_page(reading.read_host(runs_root / host, last)))


RUN_IDS = ["20261201T090000-101", "20261201T100000-202", "20261201T110000-303", "20261201T120000-404",
           "20261201T130000-505"]  # fmt: skip
BENCHMARKED = [RUN_IDS[0], RUN_IDS[2], RUN_IDS[3]]
