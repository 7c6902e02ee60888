"""Agent-R's self-training loop in one command: for each iteration and variant,
search the train split with the current model, build revision and good data,
fine-tune, and evaluate the new model on the test split (docs/iterate.md).

    python -m agentenv_servers.textcraft --port 36001 &
    TASK=textcraft ITERATIONS=3 VARIANTS=agent-r,direct,good MODEL_DIR=/models/Llama-3.1-8B-Instruct \\
        python iterate.py --name llama-textcraft

Everything goes under runs/<name>/: iter_<k>/{trees,data,model,eval} and
results.json, results.md, results.png (rewritten after every iteration).
Rerunning the same command resumes at the first unfinished stage. Exit codes:
0 all done, 1 some tree or episode failed (rerun to retry it), 2 usage error or
unreachable server, 130 interrupted (Ctrl-C or SIGTERM; finished stages are
kept).
"""
from __future__ import annotations

from agent_r.loop import IterateSettings, run
from agent_r.settings import parse, run_cli


def main(argv: list[str] | None = None) -> int:
    settings = parse(IterateSettings, argv, description=__doc__, prog="iterate.py")
    result = run(settings)
    print(result.table)
    if not settings.stop_after:
        print(f"results: {result.root}/results.md, results.json, results.png")
    if result.incomplete:
        print(result.incomplete)
    return result.exit_code


if __name__ == "__main__":
    run_cli(main)
