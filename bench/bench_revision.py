"""Verifier cost: the reference's per-pair, per-step calls vs ours (each distinct
low path once, all steps of many trees in one batched call).

    .venv/bin/python -m bench.bench_revision [--trees 8] [--per_call 0.05] [--per_token 0.01]

The model is LatencyModelBackend (a test double that sleeps like a GPU server:
a batched call costs about what its longest member costs) answering with a
fixed-length reason and a Good/Bad label hashed from the step. Trees are
synthetic (branching 3, depth 4, 30% successful leaves) built with the real
Node/conversation code. Both strategies produce the same bad prefixes; the
table shows model calls, prompts and wall time.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from agent_r import revision, verifier  # noqa: E402
from agent_r.llm import GenerationRequest, SamplingConfig  # noqa: E402
from agent_r.revision_data import PathSettings  # noqa: E402
from tests.support import tree_fixtures as tf  # noqa: E402
from tests.support.doubles import LatencyModelBackend  # noqa: E402


def policy(messages: list[dict], index: int, seed: int | None) -> str:
    step, action = tf.judged_step(messages)
    bad = hashlib.sha256(f"{step}/{action}".encode()).digest()[0] % 4 == 0
    return "The step is checked against the goal and the inventory.\nJudgment: " + ("Bad" if bad else "Good")


def synthetic_tree(seed: int, branching: int = 3, depth: int = 4):
    rng = random.Random(seed)
    root = tf.make_root(f"{tf.TASK} (variant {seed})")

    def grow(node, d):
        for b in range(branching):
            action = f"get {rng.randint(1, 9)} item{b}"
            if d == depth:
                tf.add_step(node, action, f"Got item{b}", score=1.0 if rng.random() < 0.3 else 0.0)
            else:
                grow(tf.add_step(node, action, f"Got item{b}"), d + 1)

    grow(root, 1)
    return tf.backup(root)


def reference_style(plans, cfg, backend) -> list[int]:
    """One call per step, walking each pair's low path again for every pair."""
    cuts = []
    for plan in plans:
        task = plan.root.state[3]["content"]
        for _, low in plan.pairs:
            history, cut = [], len(low)
            for k, node in enumerate(low, start=1):
                msgs = verifier.verifier_messages(task, history, node.action, node.obs, k)
                reply = backend.generate([GenerationRequest(msgs)], SamplingConfig(temperature=0.0, max_new_tokens=64))[0][0]
                history.append((node.action, node.obs))
                if verifier.parse_judgement(reply) == verifier.BAD:
                    cut = k
                    break
            cuts.append(cut)
    return cuts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trees", type=int, default=8)
    p.add_argument("--per_call", type=float, default=0.05)
    p.add_argument("--per_token", type=float, default=0.01)
    args = p.parse_args()
    cfg = PathSettings(task="textcraft", alpha=0.5, beta=0.5, max_pairs_per_tree=8).revision_config()
    plans = [revision.plan_tree(i, synthetic_tree(i), cfg) for i in range(args.trees)]
    plans = [pl for pl in plans if pl is not None]
    pairs = sum(len(pl.pairs) for pl in plans)

    rows = []
    ref = LatencyModelBackend(policy, args.per_call, args.per_token)
    t0 = time.perf_counter()
    ref_cuts = reference_style(plans, cfg, ref)
    rows.append(("per pair, per step (reference)", ref.stats.calls, ref.stats.requests, time.perf_counter() - t0))

    ours = LatencyModelBackend(policy, args.per_call, args.per_token)
    t0 = time.perf_counter()
    results = revision.process_trees(plans, cfg, ours)
    rows.append(("distinct low paths, one batch (ours)", ours.stats.calls, ours.stats.requests, time.perf_counter() - t0))

    our_cuts = [len(r["revise_feedback"]) for res in results for r in res.rows]
    assert sorted(our_cuts) == sorted(ref_cuts), "strategies disagree on bad prefixes"
    print(f"{len(plans)} trees, {pairs} pairs, per_call {args.per_call}s, per_token {args.per_token}s")
    print("| strategy | model calls | prompts | wall s |")
    print("|---|---:|---:|---:|")
    for name, calls, prompts, wall in rows:
        print(f"| {name} | {calls} | {prompts} | {wall:.2f} |")
    print(f"speed-up: {rows[0][3] / rows[1][3]:.1f}x")


if __name__ == "__main__":
    main()
