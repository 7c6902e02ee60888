"""Search one MCTS tree per training task and dump it as JSON (UCT selection,
N_GEN samples per expansion, terminal leaves backed up; docs/search.md).

    TASK=textcraft MAX_DEPTH=20 ITERA=8 N_GEN=4 python mcts_collection.py \\
        --env_server_base http://127.0.0.1:36001 --min 0 --max 100

Trees go to {output_dir}/{TASK}/{model_name}/search_results_{idx}.json, the
run manifest to manifest.json beside them. Rerunning the same command resumes.
Results do not depend on --concurrency with a backend whose samples depend
only on each request's seed (greedy decoding, scripted doubles; vllm only with
VLLM_BATCH_INVARIANT=1, see docs/backends.md); hf
sampling at TEMP>0 is seeded per batch, so it repeats only at the same
concurrency. Exit codes: 0 all done, 1 some tree failed (rerun to retry it),
2 usage error or unreachable server, 130 interrupted (Ctrl-C or SIGTERM;
finished trees are kept).
"""
from __future__ import annotations

from agent_r.search import SearchSettings, collect_trees
from agent_r.settings import EXIT_ITEMS_FAILED, EXIT_OK, parse, run_cli


def main(argv: list[str] | None = None) -> int:
    settings = parse(SearchSettings, argv, description=__doc__, prog="mcts_collection.py")
    summary = collect_trees(settings)
    print(summary.line())
    if summary.failed:
        print(f"failed tasks (rerun to retry): {sorted(summary.failed)}")
        return EXIT_ITEMS_FAILED
    return EXIT_OK


if __name__ == "__main__":
    run_cli(main)
