"""The report as a real browser shows it: headless Chromium's DOM of the page, and a screenshot of it."""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from pathlib import Path

import pytest

from specdeploy.report.pages import page_name, write_report
from specdeploy.report.plots import NO_BENCHMARK
from tests.browser.make_screenshot import (
    EXAMPLE_HOST,
    EXAMPLE_ROLLOUTS,
    WINDOW,
    chromium,
    dump_dom,
    screenshot,
    write_example_runs,
)
from tests.unit.report.helpers import parse_page

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed: apt-get install -y chromium")

BENCHMARKED = [str(r["run"]) for r in EXAMPLE_ROLLOUTS if "tps" in r]
# The page's plot colours (its CSS), as a screenshot's pixels hold them.
BAR_NEWEST = (0x25, 0x63, 0xEB)
BAR_PREVIOUS = (0x9C, 0xA3, 0xAF)
REFUSED_POINT = (0xDC, 0x26, 0x26)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    write_example_runs(root / "runs")
    host = root / "runs" / "no-bench-host"
    (host / "20261201T090000-1").mkdir(parents=True)
    (host / "20261201T090000-1" / "verdict.json").write_text('{"status": "FAILED", "elapsed_s": 3.0, "stages": []}')
    write_report(root / "runs", root / "out")
    return root / "out"


def test_the_rendered_page_has_every_rollout_and_the_three_plots(pages: Path) -> None:
    dom = dump_dom(pages / page_name(EXAMPLE_HOST))
    assert "<script" not in dom.lower()
    page = parse_page(dom)
    assert page.one("head").one("title").text() == f"specdeploy rollouts: {EXAMPLE_HOST}"
    rows = page.one("table", id="rollouts").all("tr", cls="rollout")
    assert [r.attrs["id"] for r in rows] == [f"run-{r['run']}" for r in reversed(EXAMPLE_ROLLOUTS)]
    refused = [r for r in EXAMPLE_ROLLOUTS if r.get("problems")]
    assert len(refused) == 1
    gate = page.one("tr", id=f"run-{refused[0]['run']}").one("td", cls="gate").text()
    assert gate == "refused: " + "; ".join(refused[0]["problems"])

    for plot_id in ("plot-acceptance", "plot-throughput", "plot-latency"):
        svg = page.one("svg", id=plot_id)
        assert svg.one("title", id=f"{plot_id}-title").text()
        assert svg.all("text", cls="axis-label") and svg.all("text", cls="y-tick")

    points = page.one("svg", id="plot-throughput").all("circle", cls="point")
    assert [p.tooltip().split(":")[0] for p in points] == BENCHMARKED
    assert [p.tooltip().split()[2] for p in points] == [f"{r['tps']:.1f}" for r in EXAMPLE_ROLLOUTS if "tps" in r]
    assert len(page.one("svg", id="plot-latency").all("circle", cls="point")) == 4 * len(BENCHMARKED)
    bars = page.one("svg", id="plot-acceptance")
    newest = next(r for r in reversed(EXAMPLE_ROLLOUTS) if "tps" in r)
    assert [b.tooltip() for b in bars.all("rect", cls="newest")] == [
        f"position {i}: {v * 100:.1f}% ({newest['run']})" for i, v in enumerate(newest["pos"], 1)
    ]
    assert len(bars.all("rect", cls="previous")) == len(newest["pos"])


def test_a_host_without_benchmarks_shows_the_text_not_empty_plots(pages: Path) -> None:
    page = parse_page(dump_dom(pages / page_name("no-bench-host")))
    assert page.all("svg", cls="plot") == []
    # Acceptance, throughput, latency, the speed-up over speculation off, and auto's draft schedule.
    assert [p.text() for p in page.all("p", cls="empty")] == [NO_BENCHMARK] * 5
    assert [r.attrs["id"] for r in page.all("tr", cls="rollout")] == ["run-20261201T090000-1"]


def test_the_index_links_every_host(pages: Path) -> None:
    page = parse_page(dump_dom(pages / "index.html"))
    links = {a.text(): a.attrs["href"] for a in page.one("table", id="hosts").all("a")}
    assert links == {EXAMPLE_HOST: f"{EXAMPLE_HOST}.html", "no-bench-host": "no-bench-host.html"}


def test_the_screenshot_shows_the_plots(pages: Path, tmp_path: Path) -> None:
    png = screenshot(pages / page_name(EXAMPLE_HOST), tmp_path / "report.png")
    assert png.stat().st_size > 20_000
    width, height, colours = png_colours(png)
    assert (width, height) == WINDOW
    assert len(colours) > 100  # text, anti-aliasing and plots; a blank or failed page has a handful
    assert colours.most_common(1)[0][0] == (255, 255, 255)  # the page background
    # Painted plots: the acceptance bars (newest and previous) are solid blocks of their CSS colours.
    assert colours[BAR_NEWEST] > 5_000 and colours[BAR_PREVIOUS] > 5_000
    assert colours[REFUSED_POINT] > 0  # the refused rollout's ring, in the line plots


def png_colours(path: Path) -> tuple[int, int, Counter[tuple[int, int, int]]]:
    """Width, height and pixel count per RGB colour of an 8-bit RGB(A) PNG, decoded with zlib and the PNG filters."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, bytearray(), None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    assert header is not None, "no IHDR"
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in {2, 6} and interlace == 0, f"unexpected PNG format {header}"
    channels = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(bytes(idat)), width * channels
    assert len(raw) == height * (stride + 1)
    colours: Counter[tuple[int, int, int]] = Counter()
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        row = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, channels)
        colours.update(zip(row[0::channels], row[1::channels], row[2::channels], strict=True))
        previous = row
    return width, height, colours


def _unfilter(kind: int, row: bytearray, above: bytearray, bpp: int) -> bytearray:
    """Undo one scanline's PNG filter (0 none, 1 sub, 2 up, 3 average, 4 Paeth)."""
    if kind == 2:
        return bytearray((a + b) & 255 for a, b in zip(row, above, strict=True))
    for i in range(len(row) if kind else 0):
        left = row[i - bpp] if i >= bpp else 0
        up, corner = above[i], (above[i - bpp] if i >= bpp else 0)
        if kind == 1:
            row[i] = (row[i] + left) & 255
        elif kind == 3:
            row[i] = (row[i] + (left + up) // 2) & 255
        elif kind == 4:
            guess = left + up - corner
            near_left, near_up, near_corner = abs(guess - left), abs(guess - up), abs(guess - corner)
            best = (
                left if near_left <= near_up and near_left <= near_corner else up if near_up <= near_corner else corner
            )
            row[i] = (row[i] + best) & 255
    return row
