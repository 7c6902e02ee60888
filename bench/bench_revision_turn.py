"""How reachable the revision turn is for a model, before and after revision training.

    .venv/bin/python -m bench.bench_revision_turn --episodes EVAL_DIR [--model_dir DIR ...] [--limit 30] [--cut 3]

Agent-R's revision samples teach a turn ("Thought: <a revision thought>\\nAction:
wait", answered "ok.") that the base model has never written. A real LLM
already gives that English sentence a modest probability after a failed
trajectory; a tiny model trained from scratch gives it whatever its tokenizer
and data allow. Three numbers per model:

1. Tokens: how many tokens each revision thought of agent_r.revision costs
   ("Thought: " + the sentence, as the turn writes it), against the model's
   own thoughts of about the same length (within 5 characters) in the
   episodes. A tokenizer that never saw the sentences splits them into
   pieces and the turn costs far more tokens than an ordinary one.
2. Log-probability: the summed log-probability of the whole revision turn
   (its tokens and the model's own end-of-turn token) right after a failed episode
   (``--episodes``: an eval.py output folder, whose failed episodes are the
   contexts, or a revision-task file, whose rows are; each with every
   revision thought), tokenised as at generation
   time (the chat prompt with the generation header, then the turn); and
   per context the log of their summed probabilities: the chance that a
   temperature-1 sample writes one of them. ``--cut 3`` ends each context
   after its third model turn, where training puts the revision turn (the
   first bad step), instead of at the end of a 30-turn loop.
3. Greedy: in how many contexts the model's greedy turn is a revision turn
   (what a TEMP=0 eval would do there).

Prints one line per model and writes the numbers as JSON with ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


from agent_r.io import atomic_write_json
from agent_r.conversation import HEAD_LEN
from agent_r.llm import BUNDLED_MODEL, chat_prompt, load_tokenizer
from agent_r.llm.chat import ChatFormat
from agent_r.revision import REVISION_THOUGHTS, is_revision_turn

SAME_LENGTH = 5   # characters: "an ordinary thought of the same length"


def revision_turn(thought: str) -> str:
    return f"Thought: {thought}\nAction: wait"


def failed_episodes(folder: Path, limit: int, cut: int = 0) -> list[list[dict]]:
    """The conversations of the folder's failed episodes, in task order;
    ``cut`` > 0 keeps each one's first ``cut`` model turns and their replies
    (training places the revision turn early: the first bad step). A
    revision-task file (the loop's ``revise_tasks_<task>.jsonl``: a base
    model's failed test episodes, each already cut at a random step) gives
    its rows as they are: the same contexts for every model of a run, and
    small enough to be banked with it."""
    if folder.is_file():
        rows = [json.loads(line) for line in folder.read_text().splitlines() if line.strip()]
        return [[{"role": m["role"], "content": m["content"]} for m in r["messages"]] for r in rows][:limit]
    files = sorted(folder.glob("search_results_*.json"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    if not files:
        raise SystemExit(f"{folder}: no search_results_*.json; pass an eval.py output folder with --episodes")
    out = []
    for path in files:
        episode = json.loads(path.read_text())
        # an episode cut by an env error is no failed trajectory: it may hold no turn at all
        if not episode.get("success") and not episode.get("error") and len(episode.get("state", [])) > 4:
            messages = [{"role": m["role"], "content": m["content"]} for m in episode["state"]]
            out.append(messages[:HEAD_LEN + 2 * cut] if cut else messages)
    return out[:limit]


def thought_of(turn: str) -> str:
    return turn.split("\nAction:", 1)[0].strip()


def contexts(args) -> list[list[dict]]:
    """The CLI's contexts (``--episodes --limit --cut``), with torch on ``--threads``."""
    import torch

    torch.set_num_threads(args.threads)
    episodes = failed_episodes(Path(args.episodes), args.limit, args.cut)
    if not episodes:
        raise SystemExit(f"{args.episodes}: no failed episode to use as a context")
    return episodes


def token_counts(tok, episodes: list[list[dict]]) -> dict:
    """Tokens of each revision thought vs the mean of the episodes' own thoughts of about its length."""
    def n(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    ordinary = [thought_of(m["content"]) for e in episodes for m in e[4:] if m["role"] == "assistant"]
    ordinary = [t for t in ordinary if t.startswith("Thought:")]
    rows = []
    for thought in REVISION_THOUGHTS:
        text = f"Thought: {thought}"
        same = [n(t) for t in ordinary if abs(len(t) - len(text)) <= SAME_LENGTH]
        rows.append({"chars": len(text), "tokens": n(text),
                     "ordinary_tokens": round(statistics.mean(same), 2) if same else None, "ordinary_n": len(same)})
    paired = [r for r in rows if r["ordinary_tokens"] is not None]
    return {"revision_mean": round(statistics.mean(r["tokens"] for r in rows), 2),
            "ordinary_same_length_mean": round(statistics.mean(r["ordinary_tokens"] for r in paired), 2)
            if paired else None,
            "per_thought": rows}


PARTS = ("first_word", "sentence_rest", "action")


def turn_logprobs(model, tok, episodes: list[list[dict]]) -> tuple[list[list[float]], dict[str, float]]:
    """log P(revision turn + end-of-turn | context), per context one value per
    thought; and the mean log-probability of each part of the turn: the
    thought's first word (the choice to revise), the rest of the sentence
    (writing it) and "\\nAction: wait" with the end-of-turn. Parts are split where
    the tokens of "Thought: <first word>" and "Thought: <thought>" end."""
    import torch

    eot = tok.convert_tokens_to_ids(ChatFormat(tok).end_of_turn)
    out = []
    parts = {k: 0.0 for k in PARTS}
    with torch.no_grad():
        for messages in episodes:
            context = tok(chat_prompt(tok, messages), add_special_tokens=False)["input_ids"]
            row = []
            for thought in REVISION_THOUGHTS:
                turn = tok(revision_turn(thought), add_special_tokens=False)["input_ids"] + [eot]
                ids = torch.tensor([context + turn])
                logits = model(input_ids=ids).logits[0, len(context) - 1:-1]
                logp = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(turn).unsqueeze(1))[:, 0]
                row.append(logp.sum().item())
                opening = len(tok("Thought:", add_special_tokens=False)["input_ids"])
                word = len(tok(f"Thought: {thought.split()[0]}", add_special_tokens=False)["input_ids"])
                sentence = len(tok(f"Thought: {thought}", add_special_tokens=False)["input_ids"])
                parts["first_word"] += logp[opening:word].sum().item()
                parts["sentence_rest"] += logp[word:sentence].sum().item()
                parts["action"] += logp[sentence:].sum().item()
            out.append(row)
    n = max(1, len(episodes) * len(REVISION_THOUGHTS))
    return out, {k: round(v / n, 2) for k, v in parts.items()}


def greedy_revisions(model, tok, episodes: list[list[dict]], max_new_tokens: int = 60) -> int:
    """How many contexts the model answers, greedily, with a revision turn."""
    import torch

    eot = tok.convert_tokens_to_ids(ChatFormat(tok).end_of_turn)
    n = 0
    with torch.no_grad():
        for messages in episodes:
            ids = tok(chat_prompt(tok, messages), add_special_tokens=False, return_tensors="pt")["input_ids"]
            new = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eot,
                                 pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
            n += is_revision_turn(tok.decode(new, skip_special_tokens=True))
    return n


def measure(model_dir: str, episodes: list[list[dict]]) -> dict:
    """Tokens, per-turn log-probabilities, the whole revision mass per context
    (log of the summed probabilities of the thoughts' turns: the chance a
    temperature-1 sample writes one of them verbatim) and greedy answers."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows, parts = turn_logprobs(model, tok, episodes)
    logps = [x for row in rows for x in row]
    mass = [torch.logsumexp(torch.tensor(row), 0).item() for row in rows]
    turn_tokens = [len(tok(revision_turn(t), add_special_tokens=False)["input_ids"]) + 1 for t in REVISION_THOUGHTS]
    return {"model_dir": model_dir, "tokens": token_counts(tok, episodes),
            "revision_turn_logprob_mean": round(statistics.mean(logps), 2),
            "revision_turn_logprob_min": round(min(logps), 2), "revision_turn_logprob_max": round(max(logps), 2),
            "revision_mass_logprob_mean": round(statistics.mean(mass), 2),
            "revision_mass_logprob_max": round(max(mass), 2),
            "revision_turn_logprob_parts": parts,
            "greedy_revision_turns": greedy_revisions(model, tok, episodes),
            "revision_turn_tokens_mean": round(statistics.mean(turn_tokens), 2),
            "contexts": len(episodes), "samples": len(logps)}


def report(r: dict) -> str:
    t = r["tokens"]
    return (f"{r['model_dir']}: revision thought {t['revision_mean']} tokens (ordinary thoughts of the same length "
            f"{t['ordinary_same_length_mean']}); revision turn ({r['revision_turn_tokens_mean']} tokens) log-prob: "
            f"mean {r['revision_turn_logprob_mean']} (min {r['revision_turn_logprob_min']}, "
            f"max {r['revision_turn_logprob_max']}) over {r['samples']} (context, thought) pairs; any revision "
            f"turn: log-prob mean {r['revision_mass_logprob_mean']} (max {r['revision_mass_logprob_max']}); parts "
            f"{r['revision_turn_logprob_parts']}; "
            f"greedy turn a revision in {r['greedy_revision_turns']} of {r['contexts']} contexts")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", required=True, help="an eval.py output folder (its failed episodes are the "
                        "contexts) or a revision-task file (revise_tasks_<task>.jsonl: its rows are)")
    parser.add_argument("--model_dir", nargs="+", default=[str(BUNDLED_MODEL)], help="model folders to measure")
    parser.add_argument("--limit", type=int, default=30, help="failed episodes used as contexts (the first N)")
    parser.add_argument("--cut", type=int, default=0,
                        help="keep each context's first N model turns (0 = the whole failed episode)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the numbers here as JSON")
    args = parser.parse_args()
    episodes = contexts(args)
    results = [measure(d, episodes) for d in args.model_dir]
    for r in results:
        print(report(r))
    if args.out:
        atomic_write_json(args.out, {"episodes": args.episodes, "cut": args.cut, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
