"""The tiny-model trainer: loss masks and the shared-prefix loss (cheap, tiny sizes)."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agent_r.conversation import append_turn, initial_conversation
from agentenv_servers.textcraft_env import TextCraftGame
from agentenv_servers.textcraft_expert import solve
from agentenv_client import load_instruction
from scripts.make_expert_data import expert_conversation, train_indices
from scripts.train_tiny_model import (EOT, PAD, batch_loss, collate, common_prefix_len, encode, render,
                                      train_tokenizer)


def conversations(indices):
    return [expert_conversation(TextCraftGame(i), load_instruction("textcraft")) for i in indices]


def test_expert_conversations_use_train_tasks_and_our_layout():
    train = train_indices()
    assert len(train) == 444 and not any(i < 500 and i % 5 == 0 for i in train)
    msgs = conversations([131])[0]
    game = TextCraftGame(131)
    expected = initial_conversation(load_instruction("textcraft"), game.observation)
    for step in solve(game.observation).steps:
        expected = append_turn(expected, step.turn(), game.step(step.action)[0])
    assert [{"role": m["role"], "content": m["content"]} for m in msgs] == expected
    assert [m.get("loss") for m in msgs if m["role"] == "assistant"] == [False] + [True] * (len(msgs) // 2 - 2)


def test_loss_covers_exactly_the_trained_assistant_turns():
    convs = conversations([1, 131, 302])
    tok = train_tokenizer([render(c)[0] for c in convs], 600)
    for conv in convs:
        ids, labels = encode(tok, conv)
        trained = tok.decode([t for t, y in zip(ids, labels) if y != -100], skip_special_tokens=False)
        expected = "".join(m["content"] + EOT for m in conv if m["role"] == "assistant" and m.get("loss"))
        assert trained == expected


def test_shared_prefix_loss_equals_the_plain_loss():
    convs = conversations([131, 136, 302, 301])
    tok = train_tokenizer([render(c)[0] for c in convs], 600)
    examples = [encode(tok, c) for c in convs]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                                         head_dim=64, tie_word_embeddings=True))
    pad = tok.token_to_id(PAD)
    skip = common_prefix_len(examples)
    assert skip > 200  # system prompt + instruction
    ids, labels, mask = collate(examples, [0, 1, 2, 3], pad, skip)
    fast = batch_loss(model, torch.tensor([examples[0][0][:skip]]), ids, labels, mask)
    ids, labels, mask = collate(examples, [0, 1, 2, 3], pad, 0)
    plain = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert torch.allclose(fast, plain, atol=1e-5)
