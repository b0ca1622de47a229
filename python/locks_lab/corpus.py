"""Real long texts found on any machine that runs the project: the GPL-3 text of Debian's
base-files, the Python standard library's own sources, and the GNU info manuals where they
are installed. Deterministic: the same machine image gives the same text."""
from __future__ import annotations

import gzip
import os
import sysconfig

PY_MODULES = ("argparse.py", "inspect.py", "typing.py", "dataclasses.py", "functools.py",
              "pathlib.py", "subprocess.py", "tarfile.py", "configparser.py", "logging/__init__.py")
INFO_MANUALS = ("coreutils.info.gz", "grep.info.gz", "sed.info.gz", "find.info.gz", "gzip.info.gz",
                "diffutils.info.gz")


def python_sources() -> str:
    lib = sysconfig.get_paths()["stdlib"]
    return "\n\n".join(open(os.path.join(lib, m), encoding="utf-8").read() for m in PY_MODULES)


def gpl3() -> str:
    path = "/usr/share/common-licenses/GPL-3"
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} (Debian's base-files) is missing")
    return open(path, encoding="utf-8").read()


def info_manuals() -> str:
    parts = []
    for name in INFO_MANUALS:
        path = os.path.join("/usr/share/info", name)
        if os.path.isfile(path):
            parts.append(gzip.open(path, "rt", encoding="utf-8", errors="replace").read())
    if not parts:
        raise FileNotFoundError("no GNU info manuals under /usr/share/info")
    return "\n\n".join(parts)


SOURCES = {"gpl3": gpl3, "python": python_sources, "info": info_manuals}


def text(source: str) -> str:
    """A real text by name: gpl3, python, info, or a path to a file."""
    if source in SOURCES:
        return SOURCES[source]()
    return open(source, encoding="utf-8", errors="replace").read()


def token_ids(tokenizer, source: str, n_tokens: int, offset: int = 0):
    """The first n_tokens tokens (after `offset` tokens) of a source, as a [1, n] LongTensor."""
    import torch

    ids = tokenizer(text(source), return_tensors="pt", add_special_tokens=False).input_ids[0]
    if ids.numel() < offset + n_tokens:
        raise ValueError(f"source {source!r} has {ids.numel()} tokens, fewer than {offset + n_tokens}")
    return ids[offset:offset + n_tokens].unsqueeze(0).to(torch.long)
