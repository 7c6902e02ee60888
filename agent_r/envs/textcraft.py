"""TextCraft: craft a Minecraft item from recipes. Scores 0/1."""
from agent_r.envs import EnvSpec
from agentenv_client import TextCraftEnvClient

TEXTCRAFT = EnvSpec(
    name="textcraft", default_server="http://127.0.0.1:36001", data_len=544, client_class=TextCraftEnvClient,
    train_split="textcraft_train.json", test_split="textcraft_test.json", max_score=1.0,
    max_depth=20, alpha=0.5, beta=0.5,
)
