"""A dependency-free line plot written as PNG (zlib and struct only): what benchmarks/plot.py
draws when matplotlib is not installed, so the main job (scripts/bench.sh) always leaves a plot
beside its JSON.

Two panels side by side, each with a log2 x axis (message size), and a legend below them.
Text uses a small 5x7 bitmap font drawn here (digits, letters, a few signs; uppercase letters
without a glyph of their own are drawn lowercase).
"""
import math
import struct
import zlib

# 5x7 glyphs: seven rows of five pixels, top row first.
_GLYPHS = {
    " ": "00000 00000 00000 00000 00000 00000 00000",
    "0": "01110 10001 10011 10101 11001 10001 01110",
    "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111",
    "3": "11111 00010 00100 00010 00001 10001 01110",
    "4": "00010 00110 01010 10010 11111 00010 00010",
    "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110",
    "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110",
    "9": "01110 10001 10001 01111 00001 00010 01100",
    "a": "00000 00000 01110 00001 01111 10001 01111",
    "b": "10000 10000 10110 11001 10001 10001 11110",
    "c": "00000 00000 01110 10000 10000 10001 01110",
    "d": "00001 00001 01101 10011 10001 10001 01111",
    "e": "00000 00000 01110 10001 11111 10000 01110",
    "f": "00110 01001 01000 11100 01000 01000 01000",
    "g": "00000 01111 10001 10001 01111 00001 01110",
    "h": "10000 10000 10110 11001 10001 10001 10001",
    "i": "00100 00000 01100 00100 00100 00100 01110",
    "j": "00010 00000 00110 00010 00010 10010 01100",
    "k": "10000 10000 10010 10100 11000 10100 10010",
    "l": "01100 00100 00100 00100 00100 00100 01110",
    "m": "00000 00000 11010 10101 10101 10001 10001",
    "n": "00000 00000 10110 11001 10001 10001 10001",
    "o": "00000 00000 01110 10001 10001 10001 01110",
    "p": "00000 00000 11110 10001 11110 10000 10000",
    "q": "00000 00000 01101 10011 01111 00001 00001",
    "r": "00000 00000 10110 11001 10000 10000 10000",
    "s": "00000 00000 01110 10000 01110 00001 11110",
    "t": "01000 01000 11100 01000 01000 01001 00110",
    "u": "00000 00000 10001 10001 10001 10011 01101",
    "v": "00000 00000 10001 10001 10001 01010 00100",
    "w": "00000 00000 10001 10001 10101 10101 01010",
    "x": "00000 00000 10001 01010 00100 01010 10001",
    "y": "00000 00000 10001 10001 01111 00001 01110",
    "z": "00000 00000 11111 00010 00100 01000 11111",
    "B": "11110 10001 10001 11110 10001 10001 11110",
    "G": "01110 10001 10000 10111 10001 10001 01111",
    "I": "01110 00100 00100 00100 00100 00100 01110",
    "K": "10001 10010 10100 11000 10100 10010 10001",
    "M": "10001 11011 10101 10101 10001 10001 10001",
    "O": "01110 10001 10001 10001 10001 10001 01110",
    "P": "11110 10001 10001 11110 10000 10000 10000",
    "S": "01111 10000 10000 01110 00001 00001 11110",
    "T": "11111 00100 00100 00100 00100 00100 00100",
    ".": "00000 00000 00000 00000 00000 01100 01100",
    ",": "00000 00000 00000 00000 01100 00100 01000",
    ":": "00000 01100 01100 00000 01100 01100 00000",
    "(": "00010 00100 01000 01000 01000 00100 00010",
    ")": "01000 00100 00010 00010 00010 00100 01000",
    "/": "00001 00001 00010 00100 01000 10000 10000",
    "-": "00000 00000 00000 01110 00000 00000 00000",
    "+": "00000 00100 00100 11111 00100 00100 00000",
    "=": "00000 00000 11111 00000 11111 00000 00000",
    "?": "01110 10001 00001 00010 00100 00000 00100",
}

# Line colours, distinct on white.
PALETTE = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189),
           (23, 190, 207), (140, 86, 75), (227, 119, 194)]

_WHITE, _BLACK, _GRID = (255, 255, 255), (0, 0, 0), (225, 225, 225)


class Canvas:
    def __init__(self, width, height):
        self.w, self.h = width, height
        self.px = bytearray(_WHITE * (width * height))

    def dot(self, x, y, colour):
        x, y = int(x), int(y)
        if 0 <= x < self.w and 0 <= y < self.h:
            i = 3 * (y * self.w + x)
            self.px[i:i + 3] = bytes(colour)

    def rect(self, x0, y0, x1, y1, colour):
        for y in range(int(y0), int(y1) + 1):
            for x in range(int(x0), int(x1) + 1):
                self.dot(x, y, colour)

    def line(self, x0, y0, x1, y1, colour, width=1):
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        half = (width - 1) // 2
        for k in range(steps + 1):
            t = k / steps
            x, y = round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t)
            for dy in range(-half, width - half):
                for dx in range(-half, width - half):
                    self.dot(x + dx, y + dy, colour)

    def text(self, x, y, s, colour=_BLACK, scale=1, anchor="left"):
        """Draws s with its top at y; anchor left, centre or right at x."""
        width = text_width(s, scale)
        if anchor == "centre":
            x -= width // 2
        elif anchor == "right":
            x -= width
        for ch in s:
            glyph = _GLYPHS.get(ch) or _GLYPHS.get(ch.lower()) or _GLYPHS["?"]
            for row, bits in enumerate(glyph.split()):
                for col, bit in enumerate(bits):
                    if bit == "1":
                        self.rect(x + col * scale, y + row * scale,
                                  x + col * scale + scale - 1, y + row * scale + scale - 1, colour)
            x += 6 * scale

    def png(self):
        raw = b"".join(b"\x00" + bytes(self.px[3 * self.w * y:3 * self.w * (y + 1)])
                       for y in range(self.h))

        def chunk(kind, data):
            return (struct.pack(">I", len(data)) + kind + data +
                    struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

        header = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)  # 8-bit RGB
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) +
                chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def text_width(s, scale=1):
    return 6 * scale * len(s) - scale if s else 0


def size_label(b):
    for unit, name in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if b >= unit and b % unit == 0:
            return f"{b // unit}{name}"
    return str(int(b))


def _number(v):
    if v >= 100 or v == int(v):
        return f"{v:.0f}"
    return f"{v:.2g}" if v < 1 else f"{v:.1f}"


def _nice_step(span, ticks=5):
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _panel(cv, box, series, ylog, ylabel):
    """series: [(colour, xs, ys)]; box: (left, top, right, bottom) of the plotting area."""
    left, top, right, bottom = box
    xs = [x for _, sx, _ in series for x in sx if x > 0]
    ys = [y for _, _, sy in series for y in sy if (y > 0 if ylog else True)]
    if not xs or not ys:
        return
    x0, x1 = math.log2(min(xs)), math.log2(max(xs))
    if x1 == x0:
        x1 = x0 + 1
    if ylog:
        y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
        if y1 == y0:
            y1 = y0 + 1
        yticks = [10.0 ** e for e in range(int(y0), int(y1) + 1)]
    else:
        top_value = max(ys) * 1.05 or 1.0
        step = _nice_step(top_value)
        y0, y1 = 0.0, math.ceil(top_value / step) * step
        yticks = [k * step for k in range(int(round(y1 / step)) + 1)]

    def px(x):
        return left + (math.log2(x) - x0) / (x1 - x0) * (right - left)

    def py(y):
        v = math.log10(y) if ylog else y
        return bottom - (v - y0) / (y1 - y0) * (bottom - top)

    # Grid and ticks: y at every tick, x at every power of 4 the sizes span.
    for t in yticks:
        y = py(t)
        cv.line(left, y, right, y, _GRID)
        cv.text(left - 6, int(y) - 3, _number(t), anchor="right")
    for e in range(math.ceil(x0), math.floor(x1) + 1):
        if e % 2 == math.ceil(x0) % 2 or e == math.floor(x1):
            x = px(2 ** e)
            cv.line(x, top, x, bottom, _GRID)
            cv.text(int(x), bottom + 6, size_label(2 ** e), anchor="centre")
    cv.line(left, top, left, bottom, _BLACK)
    cv.line(left, bottom, right, bottom, _BLACK)
    cv.line(right, top, right, bottom, _BLACK)
    cv.line(left, top, right, top, _BLACK)
    cv.text((left + right) // 2, bottom + 20, "message size (bytes)", anchor="centre")
    cv.text(left, top - 12, ylabel)
    for colour, sx, sy in series:
        pts = [(px(x), py(y)) for x, y in zip(sx, sy) if x > 0 and (y > 0 or not ylog)]
        for (ax, ay), (bx, by) in zip(pts, pts[1:]):
            cv.line(ax, ay, bx, by, colour, width=2)
        for x, y in pts:
            cv.rect(x - 2, y - 2, x + 2, y + 2, colour)


def write_plot(path, title, lines):
    """lines: [(name, sizes, times_us, busbw_gbps)]: bus bandwidth (left) and latency (right,
    log scale) against message size, written to `path` as PNG."""
    width, legend_rows = 1300, len(lines)
    height = 560 + 14 * legend_rows
    cv = Canvas(width, height)
    cv.text(width // 2, 12, title, scale=2, anchor="centre")
    panel_top, panel_bottom = 60, 480
    bw, lat = [], []
    for k, (_, sizes, times, busbw) in enumerate(lines):
        colour = PALETTE[k % len(PALETTE)]
        bw.append((colour, sizes, busbw))
        lat.append((colour, sizes, times))
    _panel(cv, (80, panel_top, 620, panel_bottom), bw, False, "bus bandwidth (GB/s)")
    _panel(cv, (740, panel_top, 1280, panel_bottom), lat, True, "time, median (us), log scale")
    y = panel_bottom + 44
    for k, (name, _, _, _) in enumerate(lines):
        colour = PALETTE[k % len(PALETTE)]
        cv.rect(80, y + 1, 100, y + 5, colour)
        cv.text(108, y, name)
        y += 14
    with open(path, "wb") as f:
        f.write(cv.png())
