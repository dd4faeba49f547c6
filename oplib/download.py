"""Fetching published weights into torch's hub cache, as torchvision and timm do.

``cached_download(url)`` returns the file's path in ``torch.hub.get_dir()/checkpoints``,
downloading it first where it is not there yet: to ``<name>.partial`` beside it, resumed with
an HTTP range request after a dropped connection or a truncated body (here, and in a later
call), renamed to its name only once whole, so the cache never holds a half-written file
under the real name. Progress goes to stderr. Where the file cannot be fetched (offline, a
404), the error names the URL to fetch by hand and the path to put it at.
"""

from __future__ import annotations

import http.client
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional, Union

CHUNK_BYTES = 1 << 16
# Tries per call; each one resumes from what the last one wrote.
ATTEMPTS = 4


class DownloadError(RuntimeError):
    """A file could not be downloaded; the message says what to do by hand."""


def cache_dir() -> Path:
    """Where downloaded weights are kept: ``<torch.hub.get_dir()>/checkpoints`` (``TORCH_HOME``
    moves it, as it moves torchvision's and timm's)."""
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints"


def _by_hand(url: str, path: Path) -> str:
    return f"Fetch {url} by hand and put it at {path} (or pass its path as weights=...)."


class _Progress:
    """One stderr line, rewritten at most twice a second."""

    def __init__(self, name: str, enabled: bool):
        self.name, self.enabled, self.shown = name, enabled and sys.stderr is not None, 0.0

    def update(self, done: int, total: Optional[int], final: bool = False) -> None:
        if not self.enabled or (not final and time.monotonic() - self.shown < 0.5):
            return
        self.shown = time.monotonic()
        amount = f"{done / 1e6:.1f} MB" if not total else f"{100 * done // total}% of {total / 1e6:.1f} MB"
        print(f"\roplib: downloading {self.name}: {amount}", end="\n" if final else "", file=sys.stderr, flush=True)


def _fetch(url: str, partial: Path, timeout: float, progress: _Progress) -> None:
    """Append the rest of url's body to partial (a range request from its size); raises
    http.client.IncompleteRead where the body ends early."""
    have = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        if have and response.status != 206:  # the server ignored the range: start again
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        with open(partial, "ab" if have else "wb") as out:
            done = have
            while chunk := response.read(CHUNK_BYTES):
                out.write(chunk)
                done += len(chunk)
                progress.update(done, total)
        if total is not None and done < total:
            raise http.client.IncompleteRead(b"", total - done)
        progress.update(done, total, final=True)


def cached_download(url: str, directory: Union[str, os.PathLike, None] = None, *, progress: bool = True,
                    timeout: float = 60.0) -> Path:
    """The path of url's file in ``directory`` (default: ``cache_dir()``), downloaded first
    where it is not there; raises DownloadError, saying what to do by hand, where it cannot be."""
    directory = Path(directory) if directory is not None else cache_dir()
    name = Path(urllib.parse.urlparse(url).path).name
    path = directory / name
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(name + ".partial")
    shown = _Progress(name, progress)
    last: Optional[BaseException] = None
    for _ in range(ATTEMPTS):
        try:
            _fetch(url, partial, timeout, shown)
        except urllib.error.HTTPError as error:
            if error.code == 416 and partial.exists():  # a stale partial longer than the file: start again
                partial.unlink()
                continue
            raise DownloadError(f"downloading {url} failed: HTTP {error.code} {error.reason}. {_by_hand(url, path)}") from None
        except urllib.error.URLError as error:  # no connection at all (offline, no such host)
            raise DownloadError(f"cannot reach {url} ({error.reason}). {_by_hand(url, path)}") from None
        except (http.client.HTTPException, ConnectionError, TimeoutError, OSError) as error:
            last = error  # dropped mid-way: the next attempt resumes from the partial file
            continue
        os.replace(partial, path)
        return path
    have = partial.stat().st_size if partial.exists() else 0
    raise DownloadError(
        f"downloading {url} stopped short {ATTEMPTS} times (last: {last!r}); {have} bytes are kept in {partial} and "
        f"the next call resumes from there. {_by_hand(url, path)}"
    )
