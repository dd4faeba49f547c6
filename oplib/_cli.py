"""What the commands of ``python -m oplib`` share in parsing their flags."""

from __future__ import annotations

import argparse
import inspect
import re
import shutil
import textwrap
from collections.abc import Callable


def positive(kind: type) -> Callable[[str], int | float]:
    """An argparse ``type``: ``kind(text)``, refused with a one-line message unless it is > 0."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


_MARKUP = re.compile(r":[a-z]+:`([^`]*)`|``([^`]*)``|`([^`]*)`")
_COMMAND_PREFIX = re.compile(r"^python -m oplib[\w -]*: ")


def plain(text: str) -> str:
    """Docstring text without its markup (``code``, `code`, :role:`name`), for a terminal.

    >>> plain("``python -m oplib train``: see :func:`oplib.train.main` and `--out`")
    'python -m oplib train: see oplib.train.main and --out'
    """
    return _MARKUP.sub(lambda match: next(group for group in match.groups() if group is not None), text)


def _paragraphs(block: str, width: int) -> str:
    """Each paragraph (lines between blank lines) filled to ``width``; indented blocks (the
    docstrings' examples) kept line by line."""
    parts = []
    for paragraph in block.strip("\n").split("\n\n"):
        lines = paragraph.splitlines()
        if lines and all(line.startswith("    ") or not line.strip() for line in lines):
            parts.append("\n".join(line[2:] for line in lines))
        elif any(line.lstrip().startswith("- ") for line in lines):  # a list: an item a line
            items = re.split(r"\n(?=\s*- )", paragraph)
            parts.append("\n".join(textwrap.fill(" ".join(i.split()), width, subsequent_indent="  ", break_on_hyphens=False) for i in items))
        else:
            parts.append(textwrap.fill(" ".join(paragraph.split()), width, break_on_hyphens=False))
    return "\n\n".join(parts)


def parser(prog: str, doc: str, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser whose ``--help`` shows a command's docstring whole, without markup:
    its prose before the first example block as the description (the leading
    "python -m oplib X:" dropped, ``prog`` says it), the rest (examples, then the paragraphs
    after them) as the epilog, each paragraph filled to the terminal (at most 100 columns)."""
    width = max(40, min(100, shutil.get_terminal_size().columns) - 2)
    text = plain(inspect.cleandoc(doc))
    text = _COMMAND_PREFIX.sub("", text, count=1)
    text = text[:1].upper() + text[1:]
    first_example = re.search(r"^    \S", text, flags=re.MULTILINE)
    description, epilog = (text[: first_example.start()], text[first_example.start():]) if first_example else (text, "")
    epilog = _paragraphs(epilog, width)
    return argparse.ArgumentParser(
        prog=prog,
        description=_paragraphs(description, width),
        epilog=("examples:\n" + epilog) if epilog.startswith("  ") else epilog or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kwargs,
    )


def require_extra(parser: argparse.ArgumentParser, extra: str) -> None:
    """Every package of ``extra`` (``oplib._extras.EXTRAS``) importable, else the command exits
    with code 1 and one line naming the extra: checked before any work starts."""
    from ._extras import EXTRAS, MissingExtraError, require

    for module in EXTRAS[extra][1]:
        try:
            require(module, extra, parser.prog)
        except MissingExtraError as error:
            parser.exit(1, f"{parser.prog}: {error}\n")
