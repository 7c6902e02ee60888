"""Evaluate a policy on the held-out test tasks: one episode per task, results
and a summary (score x100, success rate, steps, loops).

    TASK=textcraft MODEL_DIR=models/textcraft-tiny python eval.py --limit 20
    TASK=textcraft TEMP=1 python eval.py --samples 8     # 8 episodes a task: Pass@1, 2, 4, 8
    TASK=textcraft MODEL_DIR=models/my-model MODEL_TYPE=iter1 python eval.py
    python eval.py --compare test_result/textcraft/textcraft-tiny_eval test_result/textcraft/my-model_iter1 \\
        --plot compare.png

Results go to {output_dir}/{TASK}/{model_name}_{MODEL_TYPE}/ (the first
command's: test_result/textcraft/textcraft-tiny_eval/); rerunning the same
command resumes. Exit status: 0 every episode finished, 1 some episode
failed for good on env errors (a rerun retries it), 2 a usage error or an
unreachable server, 130 interrupted (Ctrl-C or SIGTERM; finished episodes
are kept). See docs/evaluation.md.
"""
from __future__ import annotations

from agent_r import evaluation, plots, report
from agent_r.settings import EXIT_OK, parse, run_cli


def main(argv: list[str] | None = None) -> int:
    settings = parse(evaluation.EvalSettings, argv, description=__doc__, prog="eval.py")
    if settings.compare:
        summaries = report.compare_summaries(settings.compare, settings.task)
        print(report.compare(settings.compare, summaries=summaries))
        if settings.plot:
            print(f"plot: {plots.compare_plot(summaries, report.run_labels(summaries), settings.plot)}")
        return EXIT_OK
    done = evaluation.run(settings)
    print(report.format_table([done.summary]))
    stats = done.summary.get("backend_stats")
    if stats is not None:
        print(f"model calls {stats['calls']}, requests {stats['requests']}, retries {stats['retries']}")
    if done.failed:
        print(f"{done.failed} of {done.ran} episodes failed on env errors; rerun the same command to retry them")
    print(f"results: {done.run_dir}")
    return done.exit_code


if __name__ == "__main__":
    run_cli(main)
