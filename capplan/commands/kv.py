"""`capplan kv --model llama-3.1-70b --gpu h100-80gb --gpus 4 --context 8192`: the KV-memory
bound of a replica (KV bytes per token, KV memory after weights and the activation reserve, max
concurrent sequences at a context length). ``--list`` prints the catalogue."""

from __future__ import annotations

import click

from ..errors import SpecError


@click.command("kv")
@click.option("--model", default=None, help="model name in the catalogue (e.g. llama-3.1-70b)")
@click.option("--gpu", default=None, help="GPU name in the catalogue (e.g. h100-80gb)")
@click.option("--gpus", type=int, default=None, help="GPUs per replica (TP × PP)")
@click.option("--context", "context_tokens", type=int, default=None,
              help="context length per sequence in tokens (input + output)")
@click.option("--kv-dtype", default="bf16", show_default=True, help="KV cache dtype: bf16, fp16, fp8")
@click.option("--weight-bytes", type=float, default=2.0, show_default=True,
              help="bytes per weight parameter (2 = bf16, 1 = 8-bit)")
@click.option("--reserve", type=float, default=None,
              help="fraction of each GPU's memory kept for activations, CUDA graphs and the runtime "
                   "(default 0.10, like vLLM's gpu_memory_utilization 0.9)")
@click.option("--block", "block_tokens", type=int, default=16, show_default=True,
              help="KV block size in tokens (the paged cache holds whole blocks)")
@click.option("--catalogue", type=click.Path(), default=None,
              help="a catalogue YAML of your own (default templates/catalogue.yaml)")
@click.option("--list", "list_", is_flag=True, help="print the catalogue's models and GPUs")
def cmd(model, gpu, gpus, context_tokens, kv_dtype, weight_bytes, reserve, block_tokens, catalogue,
        list_) -> int:
    """KV-memory bound of one replica: how many sequences of a context length fit."""
    from ..kv import DEFAULT_RESERVE, kv_budget, load_catalogue

    cat = load_catalogue(catalogue)
    if list_:
        click.echo(f"catalogue: {cat.file}\n")
        for kind in ("model", "gpu"):
            click.echo(cat.to_frame(kind).drop(columns="source").to_string(index=False))
            click.echo("")
        return 0
    missing = [o for o, v in (("--model", model), ("--gpu", gpu), ("--gpus", gpus),
                              ("--context", context_tokens)) if v is None]
    if missing:
        raise SpecError(f"capplan kv needs {', '.join(missing)}",
                        fix="e.g. capplan kv --model llama-3.1-70b --gpu h100-80gb --gpus 4 --context 8192 "
                            "(capplan kv --list shows the catalogue)")
    b = kv_budget(model, gpu, gpus, context_tokens=context_tokens, kv_dtype=kv_dtype,
                  weight_bytes_per_param=weight_bytes,
                  activation_reserve=DEFAULT_RESERVE if reserve is None else reserve,
                  block_tokens=block_tokens, catalogue=cat)
    click.echo(b.to_text())
    return 0 if b.weights_fit else 1
