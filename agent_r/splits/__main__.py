"""``python -m agent_r.splits``: regenerate the bundled split files."""
from agent_r.splits import main

main()
