"""Export-shaped training samples shared by the trainer tests."""
from __future__ import annotations


def export_samples() -> list[dict]:
    """Export-shaped samples: a bad prefix without loss, several user messages
    in a row, a sample over MAX_LENGTH, one with nothing to train."""
    head = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Crafting commands:\ncraft 4 stick using 2 oak planks"},
            {"role": "assistant", "content": "Ok.", "loss": False},
            {"role": "user", "content": "Goal: craft stick."}]
    turn = lambda a, loss: {"role": "assistant", "content": f"Thought: t\nAction: {a}", "loss": loss}  # noqa: E731
    obs = lambda o: {"role": "user", "content": o}  # noqa: E731
    return [
        {"messages": head + [turn("get 2 oak planks", True), obs("Got 2 oak planks"), turn("inventory", True)]},
        {"messages": head + [turn("craft 1 stick", False), obs("Could not execute"), turn("wait", True), obs("ok."),
                             turn("get 2 oak planks", True), obs("Got 2 oak planks")]},
        {"messages": head + [obs("and again"), turn("inventory", True)]},
        {"messages": head + [turn("inventory", True), obs("Inventory: " + "[oak planks] (2) " * 80),
                             turn("craft 4 stick using 2 oak planks", True)]},
        {"messages": head + [turn("inventory", False), obs("nothing")]},
    ]
