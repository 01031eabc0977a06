"""``piebald data``: turn text corpora into the token files ``piebald train --data`` reads.

The library work is ``piebald.api.prepare_data`` (which imports the runtime's data
preparation when called, so ``piebald --help`` loads neither it nor the tokenizers
library); this module parses flags, draws the progress bar on stderr and prints what was
written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from piebald.api import prepare_data
from piebald.cli.common import console, errors, user_errors

__all__ = ["data_app"]

data_app = typer.Typer(
    no_args_is_help=True, help="Prepare training data: tokenize text into token files."
)


@data_app.command("prepare")
@user_errors
def prepare(
    tokenizer: Annotated[
        Path,
        typer.Option(help="A tokenizer.json, or a Hugging Face model directory holding one."),
    ],
    out: Annotated[
        Path,
        typer.Option(
            help="Output prefix: writes PREFIX.train.bin (and PREFIX.val.bin), each with a "
            ".json sidecar and a .idx document index."
        ),
    ],
    inputs: Annotated[
        list[Path] | None,
        typer.Option(
            "--input",
            help="A .txt (one document), .jsonl (one per line) or .parquet (one per row) "
            "file; repeat it, or list more files after the options.",
        ),
    ] = None,
    more_inputs: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="[FILES]...", help="More input files (so shell globs work).", show_default=False
        ),
    ] = None,
    text_field: Annotated[
        str, typer.Option(help="The JSONL field or parquet column holding the text.")
    ] = "text",
    validation_fraction: Annotated[
        float | None,
        typer.Option(help="Put this fraction of the documents (evenly spread) in PREFIX.val.bin."),
    ] = None,
    validation_documents: Annotated[
        int | None,
        typer.Option(help="Put this many documents (evenly spread) in PREFIX.val.bin."),
    ] = None,
    append_eos: Annotated[
        bool, typer.Option(help="End each document with the tokenizer's EOS token.")
    ] = True,
    eos_token: Annotated[
        str | None,
        typer.Option(help="The EOS token to append (default: the tokenizer's own)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace existing output files.")] = False,
) -> None:
    """Tokenize text (.txt, .jsonl, .parquet) into token files, with document boundaries."""
    with _progress() as update:
        prepared = prepare_data(
            tokenizer=tokenizer,
            inputs=[*(inputs or []), *(more_inputs or [])],
            out_prefix=out,
            text_field=text_field,
            validation_fraction=validation_fraction,
            validation_documents=validation_documents,
            append_eos=append_eos,
            eos_token=eos_token,
            overwrite=force,
            progress=update,
        )
    for written in (prepared.train, prepared.val):
        if written is not None:
            console.print(
                f"{written.path}: {written.num_documents:,} documents, "
                f"{written.num_tokens:,} tokens ({written.dtype})",
                highlight=False,
            )
    console.print(
        f"tokenizer {prepared.tokenizer.path} (vocabulary {prepared.tokenizer.vocab_size:,}, "
        f"EOS {prepared.tokenizer.eos_token if append_eos else 'not appended'})",
        highlight=False,
    )


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[int, int], None]]:
    """A documents bar on stderr, drawn only on a terminal (quiet in pipes and logs)."""
    bar = Progress(
        TextColumn("tokenizing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=errors,
        transient=True,
        disable=not errors.is_terminal,
    )
    task = bar.add_task("tokenizing", total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        yield update
