"""Mutation testing of the core (not CI: it runs the tests once per mutant).

    .venv/bin/python -m bench.mutation                    # all core modules, results in /tmp/agent-r-mutation
    .venv/bin/python -m bench.mutation --modules io,tree  # some of them
    .venv/bin/python -m bench.mutation --modules added    # the bank, the calls, the loop's reruns, eval's resume
    .venv/bin/python -m bench.mutation --report           # only summarise a finished (or stopped) run

mutmut (https://github.com/boxed/mutmut, 3.x) plants one small bug at a time
(a flipped comparison, an off-by-one, a changed string or number, a dropped
call) in agent_r/{tree,search,revision,export,conversation,io}.py and
agentenv_client/*.py, and runs the tests that execute the mutated function
(mutmut records which ones on a first clean run, and stops at the first
failure). A mutant that no test notices "survives": either a test is missing,
or the mutant is equivalent (it cannot change behaviour). bench/RESULTS.md
records the score and one line per survivor.

Why it is shaped like this:
* mutmut is installed into .venv-mutmut (pip --target, git-ignored), next to
  .venv, so the project's environment (its torch above all) is not touched.
* It runs on a snapshot of the tree (``git ls-files``) in --work, so edits made
  while it runs do not mix into it, and the repository gets no mutants/ folder.
* Only in-process tests are selected (a test that runs a script in a
  subprocess cannot tell mutmut which functions it executed), and one
  TextCraft and one SciWorld server serve every mutant's run
  (TEST_TEXTCRAFT_SERVER / TEST_SCIWORLD_SERVER, tests/support/env_fixtures.py)
  instead of one per run: a 2-core box gets through the core in about an hour.
* --minutes bounds the run; what finished is kept and reported.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / ".venv-mutmut"
# mutmut and the packages it needs that .venv lacks (pip --dry-run against .venv), pinned.
MUTMUT = ["mutmut==3.8.1", "coverage==7.17.3", "libcst==1.9.0", "linkify-it-py==2.2.0", "mdit-py-plugins==0.7.0",
          "platformdirs==4.14.7", "setproctitle==1.3.8", "textual==8.2.8"]
MODULES = {
    "tree": "agent_r/tree.py", "mcts": "agent_r/mcts.py", "search": "agent_r/search.py",
    "revision": "agent_r/revision.py", "verifier": "agent_r/verifier.py", "export": "agent_r/export.py",
    "conversation": "agent_r/conversation.py", "io": "agent_r/io.py",
    "client_base": "agentenv_client/base.py", "client_textcraft": "agentenv_client/textcraft.py",
    "client_sciworld": "agentenv_client/sciworld.py", "client_webshop": "agentenv_client/webshop.py",
}
CORE = list(MODULES)
# Added since the core's run: the bank and the calls of a run in pieces, the loop's rebuild and rerun
# rules, evaluation's resume and provenance, the model check of a results folder (`--modules added`).
ADDED = {
    "pieces": "reproduction/pieces.py", "one_call": "reproduction/one_call.py", "runner": "agent_r/loop/runner.py",
    "evaluation": "agent_r/evaluation.py", "model_identity": "agent_r/model_identity.py",
}
MODULES.update(ADDED)
# In-process tests of those modules (files, folders or node ids). mutmut picks,
# per mutant, the ones that ran the mutated function.
TESTS = [
    "tests/conversation", "tests/storage", "tests/search", "tests/revision/test_pairs.py",
    "tests/revision/test_verifier.py", "tests/revision/test_splice.py", "tests/revision/test_collection_run.py",
    "tests/revision/test_part_cache.py",
    "tests/revision/test_settings.py", "tests/export/test_xtuner.py", "tests/export/test_dpo.py",
    "tests/export/test_dpo_trl.py", "tests/export/test_rows.py", "tests/export/test_cli.py",
    "tests/evaluation/test_episode.py", "tests/evaluation/test_resume.py",
    "tests/revision/test_verifier_edges.py", "tests/revision/test_pair_cap.py", "tests/export/test_good_samples.py",
    "tests/envs/test_sciworld_actions.py", "tests/clients", "tests/servers/test_textcraft_game.py",
    "tests/servers/test_textcraft_server.py", "tests/servers/test_sciworld_server.py",
    "tests/servers/test_restarts.py::test_tree_restarted_from_root_equals_the_undisturbed_tree",
    "tests/servers/test_restarts.py::test_tree_fails_after_the_bounded_restarts",
    "tests/cli/test_odd_text.py::test_odd_unicode_observations_round_trip",
    # the added modules' in-process tests
    "tests/loop/test_bank_promises.py", "tests/loop/test_one_call_budget.py", "tests/loop/test_lora_rerun.py",
    "tests/evaluation/test_provenance.py::test_revision_turns_are_counted_by_kind_and_refusals_per_episode",
    "tests/evaluation/test_model_identity.py::test_identities_compare_by_weights_first_then_by_folder",
]
# slow and about the server's JVMs, not the client: left to the normal suite
DESELECT = ["tests/servers/test_sciworld_server.py::test_create_reset_close_cycles_free_their_jvms"]
COPY = ["agentenv_servers/", "scripts/", "xtuner_config/", "models/", "mcts_collection.py", "path_collection.py",
        "eval.py", "pytest.ini"]


# Started with .venv-mutmut on PYTHONPATH, every Python process imports this.
# While mutmut records which tests run which function (MUTANT_UNDER_TEST=stats),
# a script a test runs in a subprocess, from another folder, would look for
# mutmut's config there and crash; it runs the original code instead (it
# could not report what it ran anyway). With a mutant active it runs the mutant.
SITECUSTOMIZE = """import os
if os.environ.get("MUTANT_UNDER_TEST") == "stats":
    del os.environ["MUTANT_UNDER_TEST"]
"""


def install() -> None:
    if not (LIB / "mutmut").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(LIB), "--no-deps", *MUTMUT],
                       check=True)
    (LIB / "sitecustomize.py").write_text(SITECUSTOMIZE)


def snapshot(work: Path) -> None:
    """The project's files (tracked or new, not ignored) copied into ``work``."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for name in listed:
        src = ROOT / name
        if src.is_file() and not name.startswith("work_dirs/"):
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / name)


def write_config(work: Path, modules: list[str], tests: list[str]) -> None:
    existing = [t for t in tests if (work / t.split("::")[0]).exists()]
    # mutate_only_covered_lines: a line no selected test runs gives only "no tests" mutants (e.g. the vllm
    # branch of a helper); leaving them out keeps the run within an hour on a 2-core box.
    # timeouts: a mutant that makes a search loop forever is caught by the
    # time limit; mutmut's default (15 x the test's time) spends minutes on each.
    # forkserver: workers fork from a process that only collected the tests.
    # Forked from the one that ran them (mutmut's default), they inherit the
    # locks of the threads the tests started (driver pools, tqdm, test HTTP
    # servers) and some hang until their timeout.
    lines = ["[mutmut]", "mutate_only_covered_lines=true", "timeout_multiplier=4", "timeout_constant=15",
             "process_isolation=forkserver",
             "source_paths=", "    agent_r/", "    agentenv_client/", "    reproduction/", "only_mutate="]
    lines += [f"    {MODULES[m]}" for m in modules]
    lines += ["also_copy="] + [f"    {c}" for c in COPY]
    lines += ["pytest_add_cli_args=", "    -p", "    no:randomly", "    -p", "    no:cacheprovider"]
    lines += [f"    --deselect={t}" for t in DESELECT]
    lines += ["pytest_add_cli_args_test_selection="] + [f"    {t}" for t in existing]
    (work / "setup.cfg").write_text("\n".join(lines) + "\n")


def start(module: str, work: Path) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port)], cwd=work,
                            env={**os.environ, "PYTHONPATH": str(work)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(900):
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except requests.ConnectionError:
            time.sleep(0.1)
    raise RuntimeError(f"{module} did not start")


def mutmut(work: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{LIB}:{work}", **kw.pop("env", {})}
    return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=work, env=env, **kw)


def run(work: Path, minutes: float, children: int, names: list[str]) -> None:
    servers = [start("agentenv_servers.textcraft", work), start("agentenv_servers.sciworld", work)]
    env = {"TEST_TEXTCRAFT_SERVER": servers[0][1], "TEST_SCIWORLD_SERVER": servers[1][1], "OMP_NUM_THREADS": "1"}
    log = open(work / "mutmut.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *names],
                            cwd=work, env={**os.environ, "PYTHONPATH": f"{LIB}:{work}", **env}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.wait(timeout=minutes * 60)
    except subprocess.TimeoutExpired:
        print(f"stopping mutmut after {minutes:g} minutes; reporting what finished", flush=True)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    finally:
        for server, _ in servers:
            server.terminate()
            server.wait()


STATUS = re.compile(r"^\s*([\w.]+__mutmut_\d+): (.+)$")


def report(work: Path, diffs: bool = True) -> dict:
    """Per module: mutants by status; survivors (with their diff lines)."""
    out = mutmut(work, "results", "--all", "true", capture_output=True, text=True).stdout
    confirmed = json.loads((work / "confirmed.json").read_text()) if (work / "confirmed.json").exists() else {}
    by_module: dict[str, Counter] = {}
    survivors = []
    for line in out.splitlines():
        m = STATUS.match(line)
        if not m:
            continue
        name, status = m.groups()
        if status == "survived" and confirmed.get(name) == "killed":
            status = "killed (confirm)"
        module = name.split(".x_")[0].split(".xǁ")[0]
        by_module.setdefault(module, Counter())[status] += 1
        if status in ("survived", "no tests", "timeout", "suspicious"):
            diff = mutmut(work, "show", name, capture_output=True, text=True).stdout if diffs else ""
            changed = [d for d in diff.splitlines() if d[:1] in "+-" and d[:3] not in ("+++", "---")]
            survivors.append({"name": name, "status": status, "diff": changed})
    total = Counter()
    for counts in by_module.values():
        total.update(counts)
    data = {"modules": {k: dict(v) for k, v in sorted(by_module.items())}, "total": dict(total),
            "survivors": survivors}
    (work / "report.json").write_text(json.dumps(data, indent=1, ensure_ascii=False))
    return data


def confirm(work: Path, tests: list[str], minutes: float) -> dict[str, str]:
    """Each survivor against ``tests`` (the current tests/ copied in), run the
    way mutmut runs a mutant (MUTANT_UNDER_TEST in the mutants folder): a kill
    found by tests written after the run, or by tests that run scripts in
    subprocesses (which mutmut cannot map to functions). Returns name ->
    "killed" | "survived"; kept in confirmed.json, which report() reads."""
    shutil.rmtree(work / "mutants" / "tests")
    shutil.copytree(ROOT / "tests", work / "mutants" / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    servers = [start("agentenv_servers.textcraft", work), start("agentenv_servers.sciworld", work)]
    env = {**os.environ, "PYTHONPATH": f"{LIB}:{work}", "TEST_TEXTCRAFT_SERVER": servers[0][1],
           "TEST_SCIWORLD_SERVER": servers[1][1], "OMP_NUM_THREADS": "1"}
    path = work / "confirmed.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    deadline = time.monotonic() + minutes * 60
    try:
        for s in report(work, diffs=False)["survivors"]:
            if s["name"] in done or time.monotonic() > deadline:
                continue
            res = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p",
                                  "no:cacheprovider", *tests], cwd=work / "mutants",
                                 env={**env, "MUTANT_UNDER_TEST": s["name"]}, capture_output=True, text=True)
            done[s["name"]] = "survived" if res.returncode == 0 else "killed"
            path.write_text(json.dumps(done, indent=1, ensure_ascii=False))
            print(f"{s['name']}: {done[s['name']]}", flush=True)
    finally:
        for server, _ in servers:
            server.terminate()
            server.wait()
    return done


def module_list(given: str) -> list[str]:
    """--modules: names, and the groups core and added."""
    out: list[str] = []
    for name in filter(None, given.split(",")):
        for m in {"core": CORE, "added": list(ADDED)}.get(name, [name]):
            if m not in MODULES:
                raise SystemExit(f"--modules: unknown module {m!r}; choose from core, added, {', '.join(MODULES)}")
            out += [m] if m not in out else []
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modules", default="core", help="comma list of: core (the default), added, "
                        + ", ".join(MODULES))
    parser.add_argument("--work", default="/tmp/agent-r-mutation", help="the snapshot and mutmut's state")
    parser.add_argument("--minutes", type=float, default=90, help="stop after this long, report what finished")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--report", action="store_true", help="only summarise the run in --work")
    parser.add_argument("--resume", action="store_true", help="go on with the run in --work (mutants already "
                        "tested keep their result)")
    parser.add_argument("--only", default="", help="with --resume: comma list of mutant name patterns, in "
                        "order of priority (e.g. 'agent_r.tree*,agent_r.io*')")
    parser.add_argument("--confirm", nargs="+", metavar="TEST", help="run each survivor of the run in --work "
                        "against these tests (new tests, or ones that run scripts in subprocesses)")
    parser.add_argument("--retest", action="store_true", help="copy the current tests/ into --work and rerun "
                        "only the mutants that survived (after adding tests)")
    args = parser.parse_args()
    work = Path(args.work)
    install()
    if args.confirm:
        confirm(work, args.confirm, args.minutes)
    elif args.retest:
        names = [s["name"] for s in report(work, diffs=False)["survivors"] if s["status"] != "not checked"]
        for sub in (work, work / "mutants"):
            shutil.rmtree(sub / "tests")
            shutil.copytree(ROOT / "tests", sub / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        write_config(work, module_list(args.modules), TESTS)
        shutil.copy2(work / "setup.cfg", work / "mutants" / "setup.cfg")
        run(work, args.minutes, args.max_children, [])       # the mutants not tested yet ...
        run(work, args.minutes, args.max_children, names)    # ... and the survivors, against the new tests
    elif args.resume:
        run(work, args.minutes, args.max_children, args.only.split(",") if args.only else [])
    elif not args.report:
        snapshot(work)
        write_config(work, module_list(args.modules), TESTS)
        run(work, args.minutes, args.max_children, [])
    data = report(work)
    for module, counts in data["modules"].items():
        print(f"{module}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    total = data["total"]
    killed = total.get("killed", 0) + total.get("killed (confirm)", 0)
    print(f"total: {sum(total.values())} mutants, {killed} killed "
          f"({100 * killed / max(1, sum(total.values())):.1f}%); survivors in {work / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
