"""The tiny-model trainer: loss masks and the shared-prefix loss (cheap, tiny sizes)."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agent_r.conversation import append_turn, initial_conversation
from agentenv_servers.textcraft_env import TextCraftGame
from agentenv_servers.textcraft_expert import solve
from agentenv_client import load_instruction
from scripts.make_expert_data import expert_conversation, goal_chain_turns, train_indices
from scripts.train_tiny_model import (EOT, PAD, batch_loss, collate, common_prefix_len, encode, pack_examples,
                                      render, train_tokenizer)


def conversations(indices):
    return [expert_conversation(TextCraftGame(i), load_instruction("textcraft")) for i in indices]


def test_expert_conversations_use_train_tasks_and_our_layout():
    train = train_indices()
    assert len(train) == 444 and not any(i < 500 and i % 5 == 0 for i in train)
    msgs = conversations([131])[0]
    game = TextCraftGame(131)
    expected = initial_conversation(load_instruction("textcraft"), game.observation)
    plan = solve(game.observation)
    for step, turn in zip(plan.steps, goal_chain_turns(plan)):
        expected = append_turn(expected, turn, game.step(step.action)[0])
    assert [{"role": m["role"], "content": m["content"]} for m in msgs] == expected
    assert [m.get("loss") for m in msgs if m["role"] == "assistant"] == [False] + [True] * (len(msgs) // 2 - 2)
    # every thought but the last opens with the chain from the goal to its item
    thoughts = [m["content"].split("\n")[0] for m in msgs[4::2]]
    assert all(t.startswith("Thought: acacia sign needs ") for t in thoughts[:-1])
    assert thoughts[-1] == "Thought: I can craft acacia sign now."


def test_loss_covers_exactly_the_trained_assistant_turns():
    convs = conversations([1, 131, 302])
    tok = train_tokenizer([render(c)[0] for c in convs], 600)
    for conv in convs:
        ids, labels = encode(tok, conv)
        trained = tok.decode([t for t, y in zip(ids, labels) if y != -100], skip_special_tokens=False)
        expected = "".join(m["content"] + EOT for m in conv if m["role"] == "assistant" and m.get("loss"))
        assert trained == expected


def tiny_model(tok):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                                        head_dim=64, tie_word_embeddings=True))


def plain_loss(model, examples, pad):
    """The textbook loss: each example its own padded row, labels shifted by one."""
    n = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), n), pad)
    labels = torch.full((len(examples), n), -100)
    mask = torch.zeros((len(examples), n), dtype=torch.long)
    for row, (x, y) in enumerate(examples):
        ids[row, :len(x)], labels[row, :len(y)], mask[row, :len(x)] = torch.tensor(x), torch.tensor(y), 1
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


def test_shared_prefix_loss_equals_the_plain_loss():
    convs = conversations([131, 136, 302, 301])
    tok = train_tokenizer([render(c)[0] for c in convs], 600)
    examples = [encode(tok, c) for c in convs]
    model = tiny_model(tok)
    pad = tok.token_to_id(PAD)
    packs = [pack_examples([e]) for e in examples]
    skip = common_prefix_len(packs)
    assert skip > 200  # system prompt + instruction
    fast = batch_loss(model, torch.tensor([packs[0].ids[:skip]]), collate(packs, [0, 1, 2, 3], pad, skip))
    assert torch.allclose(fast, plain_loss(model, examples, pad), atol=1e-5)


def test_a_pack_of_examples_sharing_a_prompt_gives_each_its_own_loss():
    """Three replies to one prompt and two to another, packed as token trees:
    the same loss as five separate rows (each token counted once per example)."""
    prompt_a = [{"role": "system", "content": "Judge."}, {"role": "user", "content": "Step: get 1 oak log"}]
    prompt_b = [{"role": "system", "content": "Judge."}, {"role": "user", "content": "Step: craft 4 oak planks"}]
    replies = ["Good, it helps.", "Bad, it fails.", "Uncertain for now."]
    convs = [p + [{"role": "assistant", "content": r}] for p, rs in ((prompt_a, replies), (prompt_b, replies[:2]))
             for r in rs]
    tok = train_tokenizer([render(c)[0] for c in convs], 400)
    examples = [encode(tok, c) for c in convs]
    model = tiny_model(tok)
    pad = tok.token_to_id(PAD)
    packs = [pack_examples(examples[:3]), pack_examples(examples[3:])]
    assert len(packs[0]) < sum(len(ids) for ids, _ in examples[:3])
    skip = common_prefix_len(packs)
    packed = batch_loss(model, torch.tensor([packs[0].ids[:skip]]), collate(packs, [0, 1], pad, skip))
    assert torch.allclose(packed, plain_loss(model, examples, pad), atol=1e-5)


def test_verifier_examples_are_path_collections_prompt_with_computed_labels():
    """The bundled model learns to judge on exactly the prompt path_collection
    sends (same builder, same budget), and its labels follow the game: a needed
    item Good, a rejected action or an unused item Bad, inventory Uncertain."""
    from agent_r import verifier
    from scripts.make_verifier_data import TokenCounter, example, ground_truth, revision_config

    game = TextCraftGame(46)
    task = game.observation      # glistering melon slice from 8 gold nugget + 1 melon slice
    got = game.step("get 8 gold nugget")[0]
    assert ground_truth(task, "get 8 gold nugget", got)[0] == verifier.GOOD
    assert ground_truth(task, "craft 1 melon using 9 melon slice",
                        TextCraftGame(46).step("craft 1 melon using 9 melon slice")[0])[0] == verifier.BAD
    unused = TextCraftGame(46).step("get 1 carrot")[0]
    assert unused.startswith("Got") and ground_truth(task, "get 1 carrot", unused)[0] == verifier.BAD
    assert ground_truth(task, "inventory", "Inventory: [gold nugget] (8)")[0] == verifier.UNCERTAIN

    cfg = revision_config(2048)
    row = example(TokenCounter("models/textcraft-tiny"), cfg, task, [], "get 8 gold nugget", got, {})
    prompt, reply = row["messages"][:-1], row["messages"][-1]
    assert prompt == verifier.verifier_messages(task, [], "get 8 gold nugget", got, 1)   # no history to cut
    assert reply["loss"] is True and verifier.parse_judgement(reply["content"]) == verifier.GOOD


def test_training_from_scratch_runs_through_the_fine_tunes_loop(tmp_path, monkeypatch):
    """The bundled models are trained by the same optimizer loop as the
    CPU fine-tune (agent_r.training.cpu.train_steps): a tiny from-scratch run
    takes every step through it, its loss falls, and the saved folder loads
    in transformers with the task list it was taught."""
    import json

    import scripts.train_tiny_model as tiny
    from agent_r.training import cpu
    from scripts.make_expert_data import make_rows

    rows, problems = make_rows([131, 132, 133], variants=2, seed=0, instruction=load_instruction("textcraft"))
    assert rows and not problems
    data = tmp_path / "policy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls = []

    def counted(*args, **kwargs):
        losses = cpu.train_steps(*args, **kwargs)
        calls.append(losses)
        return losses

    monkeypatch.setattr(tiny, "train_steps", counted)
    cfg = tiny.TrainConfig(data=str(data), out=str(tmp_path / "model"), threads=1, vocab_size=400, hidden=64,
                           layers=1, intermediate=128, steps=30, batch_size=4, warmup=3)
    stats = tiny.train(cfg)
    [losses] = calls
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert stats["final_loss_ema"] < losses[0]
    model = LlamaForCausalLM.from_pretrained(tmp_path / "model")
    assert model.config.hidden_size == 64
    taught = json.loads((tmp_path / "model" / "training_tasks.json").read_text())
    assert taught["policy"] == [131, 132, 133]
