"""Truncation to MAX_TOKEN_LENGTH: the oldest (turn, observation) pairs go
first, the four head messages always stay, and so does the newest pair even
when the prompt is still too long."""
from __future__ import annotations

from agent_r.conversation import append_turn, initial_conversation, truncate


def test_truncate_drops_oldest_pairs_and_keeps_head():
    """At 10 tokens a message, a budget of 140 keeps the head and the two newest
    pairs; a budget too small for one pair still keeps the newest."""
    msgs = initial_conversation("i", "o")
    for k in range(5):
        msgs = append_turn(msgs, f"Action: a{k}", f"obs{k}")
    count = lambda m: 10 * len(m)  # noqa: E731 - 10 tokens per message
    out = truncate(msgs, max_tokens=60 + 80, count_tokens=count)
    assert out[:4] == msgs[:4]
    assert len(out) == 8 and out[4]["content"] == "Action: a3"
    assert [m["role"] for m in out[4:]] == ["assistant", "user"] * 2
    # never drops the newest pair even if still too long
    assert truncate(msgs, max_tokens=61, count_tokens=count)[4:] == msgs[-2:]


def words(messages):
    """Token count stand-in: whitespace-separated words."""
    return sum(len(m["content"].split()) for m in messages)


def test_truncate_drops_oldest_pairs_until_the_budget_fits():
    """For every budget, exactly as many newest pairs as fit are kept (one token
    less drops one more); a huge budget keeps everything."""
    head = initial_conversation("one two", "three four")             # 4 words + "Ok." = 6 ... see words()
    msgs = head
    for i in range(5):
        msgs = append_turn(msgs, f"turn{i} a b c", f"obs{i} d e")     # 7 words per pair
    base = words(head)
    for pairs in range(1, 6):
        budget = base + 7 * pairs + 60
        out = truncate(msgs, budget, words)
        assert out[:4] == head and out[4:] == msgs[len(msgs) - 2 * pairs:]
        assert truncate(msgs, budget - 1, words)[4:] == msgs[len(msgs) - 2 * max(pairs - 1, 1):]
    assert truncate(msgs, 10, words) == head + msgs[-2:]            # the newest pair always stays
    assert truncate(msgs, 10_000, words) == msgs


def test_truncate_counts_a_long_history_a_logarithmic_number_of_times():
    """A 100-turn episode's prompt is re-fitted every turn: the chat is counted
    about log2(pairs) times, not once per dropped pair, and the kept pairs are
    exactly what dropping one pair at a time keeps, for every budget."""
    msgs = initial_conversation("one two", "three four")
    for i in range(100):
        msgs = append_turn(msgs, f"turn{i} " + "w " * (i % 7), f"obs{i} d")
    calls = []

    def counting(m):
        calls.append(1)
        return words(m)

    def one_pair_at_a_time(budget):
        tail = msgs[4:]
        while len(tail) > 2 and words(msgs[:4] + tail) > budget - 60:
            tail = tail[2:]
        return msgs[:4] + tail

    for budget in range(60, words(msgs) + 62, 37):
        calls.clear()
        assert truncate(msgs, budget, counting) == one_pair_at_a_time(budget)
        assert len(calls) <= 8        # 1 + ceil(log2(100))
