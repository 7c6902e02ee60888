"""Revision (or good-only) training data from MCTS trees: pairs of a high and a
low leaf path, the low path judged step by step, spliced (docs/revision.md).

    TASK=textcraft MODEL_DIR=models/textcraft-tiny python path_collection.py --data_type centric --revise 1
    TASK=textcraft python path_collection.py --data_type good
    python path_collection.py export --format xtuner --output mcts_training_data/train.json \\
        --input mcts_training_data/textcraft_centric.jsonl mcts_training_data/textcraft_good.jsonl

Reads the trees mcts_collection.py wrote for the same settings: --input_dir
(the tree folder, or mcts_collection.py's --output_dir), else
{output_dir}/{TASK}/{model} when it holds trees, else mcts_result/{TASK}/{model}.
Writes {output_dir}/{TASK}_{data_type}.jsonl and its manifest; rerunning the
same command resumes from per-tree parts. A model is loaded only for
--data_type centric --revise 1, and only when some tree still needs judging.
`path_collection.py export ...` writes training files (XTuner or DPO) from
these JSONL files; see `path_collection.py export --help`. Exit codes: 0 all
done, 1 some tree failed (rerun to retry it), 2 usage error or unreachable
server, 130 interrupted (Ctrl-C or SIGTERM; finished tree parts are kept).
"""
from __future__ import annotations

import sys

from agent_r.paths import revision_input
from agent_r.revision_data import PathSettings, collect
from agent_r.settings import parse, run_cli


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        from agent_r import export

        return export.main(argv[1:])
    settings = parse(PathSettings, argv, description=__doc__, prog="path_collection.py")
    # first, so a wrong MODEL_NAME / --input_dir shows before any row is written
    print(f"reading the trees in {revision_input(settings)}", flush=True)
    result = collect(settings)
    print(result.report())
    if result.problem:
        print(result.problem, file=sys.stderr)
    return result.exit_code


if __name__ == "__main__":
    run_cli(main)
