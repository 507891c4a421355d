"""Render a run's HTML page to PNG with headless Chromium, and read the picture back: is it blank, how many node rows?

    python tests/tools/report_png.py PAGE.html OUT.png [--nodes N]   render; with --nodes, fail unless it shows N rows

The rows are counted in the picture, not in the HTML: the timeline draws a strip per node in a colour no other element
of the page has (plugins/plugin_utils/_html_report.py, ROW_MARK), and this counts the separate runs of that colour
down one pixel column. Only the standard library: PNG is decoded here (8-bit RGB or RGBA, not interlaced).
"""

from __future__ import annotations

import argparse
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

ROW_MARK = (0x0B, 0x1F, 0x33)
MARK_COLUMN = 27  # body margin 24 px + the strip's x (2..5) in the timeline's SVG
WIDTH = 1280


def chromium() -> str | None:
    return next((path for path in (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")) if path), None)


def render(page: Path, out: Path, height: int, width: int = WIDTH) -> None:
    browser = chromium()
    if browser is None:
        raise FileNotFoundError("no chromium on PATH (Debian: apt-get install chromium)")
    # --no-sandbox: Chromium's sandbox refuses to run as root, which the lab and CI are
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1",
                    f"--window-size={width},{height}", f"--screenshot={out}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)


def decode(data: bytes) -> tuple[int, int, list[bytes], int]:
    """(width, height, rows of raw pixel bytes, bytes per pixel)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    position, chunks, header = 8, [], None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    width, height, depth, colour, _compression, _filter, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
    pixel = 3 if colour == 2 else 4
    raw, stride, rows, previous = zlib.decompress(b"".join(chunks)), width * pixel, [], bytes(width * pixel)
    for line in range(height):
        kind, scan = raw[line * (stride + 1)], bytearray(raw[line * (stride + 1) + 1:(line + 1) * (stride + 1)])
        for index in range(stride):
            left = scan[index - pixel] if index >= pixel else 0
            up, corner = previous[index], previous[index - pixel] if index >= pixel else 0
            if kind == 1:
                scan[index] = (scan[index] + left) & 0xFF
            elif kind == 2:
                scan[index] = (scan[index] + up) & 0xFF
            elif kind == 3:
                scan[index] = (scan[index] + (left + up) // 2) & 0xFF
            elif kind == 4:
                estimate = left + up - corner
                nearest = min((abs(estimate - left), 0, left), (abs(estimate - up), 1, up), (abs(estimate - corner), 2, corner))[2]
                scan[index] = (scan[index] + nearest) & 0xFF
        rows.append(bytes(scan))
        previous = scan
    return width, height, rows, pixel


def read_picture(png: Path) -> dict:
    """What the picture shows: its size, how much of it is not white, how many colours, and the node rows."""
    width, height, rows, pixel = decode(png.read_bytes())
    inked, colours = 0, set()
    for row in rows[::4]:
        for x in range(0, width * pixel, pixel * 4):
            colour = tuple(row[x:x + 3])
            colours.add(colour)
            inked += colour != (255, 255, 255)
    marks, inside = 0, False
    for row in rows:
        hit = tuple(row[MARK_COLUMN * pixel:MARK_COLUMN * pixel + 3]) == ROW_MARK
        marks += hit and not inside
        inside = hit
    return {"width": width, "height": height, "inked_share": inked / max(1, (height // 4) * (width // 4)), "colours": len(colours),
            "node_rows": marks}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("page")
    parser.add_argument("png")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--height", type=int, default=0, help="window height (default: enough for the timeline of the node count)")
    parser.add_argument("--width", type=int, default=WIDTH, help="window width (a narrow one is quicker to read back)")
    args = parser.parse_args(argv)
    nodes = args.nodes or 3
    render(Path(args.page), Path(args.png), args.height or 650 + (20 if nodes <= 30 else 12 if nodes <= 80 else 7) * nodes, args.width)
    seen = read_picture(Path(args.png))
    print(seen)
    if seen["inked_share"] < 0.01 or seen["colours"] < 8:
        print("the picture is blank", file=sys.stderr)
        return 1
    if args.nodes is not None and seen["node_rows"] != args.nodes:
        print(f"the picture shows {seen['node_rows']} node rows, expected {args.nodes}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
