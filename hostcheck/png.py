"""The one PNG engine: a small RGB canvas (dots, filled rectangles, lines, a 5x7 bitmap font) encoded as PNG with
the standard library (zlib, struct).

hostcheck runs on the node with the standard library alone, so it cannot count on PIL or matplotlib: the job
doctor's timeline (hostcheck.job.png) and the bench's bar chart (hostcheck.bench.chart) are drawn with this.
"""

from __future__ import annotations

import struct
import zlib

WHITE = (255, 255, 255)
BLACK = (0, 0, 0)
GREY = (120, 120, 120)
GRID = (228, 228, 228)
RED = (214, 69, 65)
RED_FILL = (246, 196, 193)
GREEN = (34, 139, 34)
BLUE = (49, 99, 190)
ORANGE = (230, 140, 20)

# The classic 5x7 font (ASCII 32-126), five columns per glyph, bit 0 the top row.
_FONT_HEX = (
    "0000000000"
    "00005f0000"
    "0007000700"
    "147f147f14"
    "242a7f2a12"
    "2313086462"
    "3649552250"
    "0005030000"
    "001c224100"
    "0041221c00"
    "082a1c2a08"
    "08083e0808"
    "0050300000"
    "0808080808"
    "0060600000"
    "2010080402"
    "3e5149453e"
    "00427f4000"
    "4261514946"
    "2141454b31"
    "1814127f10"
    "2745454539"
    "3c4a494930"
    "0171090503"
    "3649494936"
    "064949291e"
    "0036360000"
    "0056360000"
    "0814224100"
    "1414141414"
    "0041221408"
    "0201510906"
    "324979413e"
    "7e1111117e"
    "7f49494936"
    "3e41414122"
    "7f4141221c"
    "7f49494941"
    "7f09090101"
    "3e41415132"
    "7f0808087f"
    "00417f4100"
    "2040413f01"
    "7f08142241"
    "7f40404040"
    "7f0204027f"
    "7f0408107f"
    "3e4141413e"
    "7f09090906"
    "3e4151215e"
    "7f09192946"
    "4649494931"
    "01017f0101"
    "3f4040403f"
    "1f2040201f"
    "7f2018207f"
    "6314081463"
    "0304780403"
    "6151494543"
    "007f414100"
    "0204081020"
    "0041417f00"
    "0402010204"
    "4040404040"
    "0001020400"
    "2054545478"
    "7f48444438"
    "3844444420"
    "384444487f"
    "3854545418"
    "087e090102"
    "0c5252523e"
    "7f08040478"
    "00447d4000"
    "2040443d00"
    "007f102844"
    "00417f4000"
    "7c04180478"
    "7c08040478"
    "3844444438"
    "7c14141408"
    "081414187c"
    "7c08040408"
    "4854545420"
    "043f444020"
    "3c4040207c"
    "1c2040201c"
    "3c4030403c"
    "4428102844"
    "0c5050503c"
    "4464544c44"
    "0008364100"
    "00007f0000"
    "0041360800"
    "0201020402"
)
FONT = {chr(32 + i): bytes.fromhex(_FONT_HEX[10 * i : 10 * i + 10]) for i in range(len(_FONT_HEX) // 10)}


class Canvas:
    def __init__(self, width: int, height: int, background: tuple[int, int, int] = WHITE) -> None:
        self.w, self.h = width, height
        self.px = bytearray(bytes(background) * (width * height))

    def dot(self, x: int, y: int, c: tuple[int, int, int]) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = 3 * (y * self.w + x)
            self.px[i : i + 3] = bytes(c)

    def rect(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        """Filled, corners included."""
        x0, x1 = sorted((max(0, x0), min(self.w - 1, x1)))
        y0, y1 = sorted((max(0, y0), min(self.h - 1, y1)))
        row = bytes(c) * (x1 - x0 + 1)
        for y in range(y0, y1 + 1):
            i = 3 * (y * self.w + x0)
            self.px[i : i + len(row)] = row

    def line(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int], width: int = 1) -> None:
        """Bresenham, ``width`` pixels thick."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        half = width // 2
        while True:
            if width == 1:
                self.dot(x0, y0, c)
            else:
                self.rect(x0 - half, y0 - half, x0 - half + width - 1, y0 - half + width - 1, c)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, s: str, c: tuple[int, int, int] = BLACK, scale: int = 1) -> int:
        """Draw ``s`` with its top-left corner at (x, y); returns the x after it."""
        for ch in s:
            glyph = FONT.get(ch, FONT["?"])
            for col, bits in enumerate(glyph):
                for row in range(7):
                    if bits >> row & 1:
                        self.rect(
                            x + col * scale,
                            y + row * scale,
                            x + col * scale + scale - 1,
                            y + row * scale + scale - 1,
                            c,
                        )
            x += 6 * scale
        return x

    def png(self) -> bytes:
        return encode_png(self.w, self.h, bytes(self.px))


def text_width(s: str, scale: int = 1) -> int:
    return 6 * scale * len(s)


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """8-bit RGB, no interlace; each row with the Sub filter (flat colours compress to almost nothing)."""
    stride = 3 * width
    raw = bytearray()
    for y in range(height):
        row = rgb[y * stride : (y + 1) * stride]
        sub = bytes((row[i] - (row[i - 3] if i >= 3 else 0)) & 0xFF for i in range(stride))
        raw += b"\x01" + sub

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(bytes(raw), 9))
        + chunk(b"IEND", b"")
    )
