"""Go's ``text/tabwriter`` with flags 0 and a space pad character, as gpushare's inspect uses it.

Role: ``kubectl inspect gpushare`` must print what gpushare's own plugin prints byte for byte
(scripts parse it), and that plugin writes through ``tabwriter.NewWriter(os.Stdout, 0, 0, 2,
' ', 0)``. Go's layout is not a plain "pad every column to its widest cell": columns are
aligned per *column block* (consecutive lines that have a cell in that column), the text after
a line's last tab is never padded, and a tab-terminated cell is padded even at the end of a
line (trailing spaces). This is the same algorithm (``Writer.format`` / ``writeLines``).

Invariants: pure; ASCII widths (Kubernetes names and numbers are ASCII; Go counts runes).
"""

from __future__ import annotations

__all__ = ["tabwrite"]


def tabwrite(text: str, *, minwidth: int = 0, padding: int = 2) -> str:
    """``text`` as Go's tabwriter prints it once flushed."""
    lines = [line.split("\t") for line in text.split("\n")]
    if lines[-1][-1] == "":
        lines[-1].pop()  # Flush keeps an unterminated last cell only when it has text
    out: list[str] = []
    _format(lines, [], 0, len(lines), out, minwidth, padding)
    return "".join(out)


def _format(
    lines: list[list[str]],
    widths: list[int],
    line0: int,
    line1: int,
    out: list[str],
    minwidth: int,
    padding: int,
) -> None:
    column = len(widths)
    this = line0
    while this < line1:
        if column >= len(lines[this]) - 1:
            this += 1
            continue
        # a block of lines with a cell in this column begins: print the lines before it
        _write_lines(lines, widths, line0, this, out)
        line0 = this
        width = minwidth
        while this < line1 and column < len(lines[this]) - 1:
            width = max(width, len(lines[this][column]) + padding)
            this += 1
        widths.append(width)
        _format(lines, widths, line0, this, out, minwidth, padding)
        widths.pop()
        line0 = this
        this += 1  # Go's loop steps past the line that ended the block (it has no such cell)
    _write_lines(lines, widths, line0, line1, out)


def _write_lines(
    lines: list[list[str]], widths: list[int], line0: int, line1: int, out: list[str]
) -> None:
    for i in range(line0, line1):
        for j, cell in enumerate(lines[i]):
            out.append(cell.ljust(widths[j]) if j < len(widths) else cell)
        if i + 1 < len(lines):
            out.append("\n")
