"""Which extra of ``pyproject.toml`` installs each optional dependency, and the line that
says how. Planning and simulation need none of them; training, profiling and data
preparation do. The command line reports a missing one in one line
(``cli.common.user_errors``), and the data pipeline names it where it imports one
(``runtime.data.text_tokenizer.require_module``)."""

from __future__ import annotations

__all__ = ["EXTRA_OF_MODULE", "install_hint"]

EXTRA_OF_MODULE = {
    "torch": "train",
    "safetensors": "train",
    "tokenizers": "data",
    "pyarrow": "data",
    "tensorboardX": "tensorboard",
}


def install_hint(module: str) -> str | None:
    """``pip install 'piebald[EXTRA]'`` for ``module`` (or a submodule of it), or None for
    a module no extra installs."""
    extra = EXTRA_OF_MODULE.get(module.partition(".")[0])
    return None if extra is None else f"pip install 'piebald[{extra}]'"
