"""WebShop: buy a product matching an instruction. Scores in [0, 1] at "buy now".
No bundled splits: the product data cannot ship, so users pass AgentGym's lists."""
from agent_r.envs import EnvSpec
from agentenv_client import WebshopEnvClient

WEBSHOP = EnvSpec(
    name="webshop", default_server="http://127.0.0.1:36003", data_len=12087, client_class=WebshopEnvClient,
    train_split=None, test_split=None, max_score=1.0, max_depth=10, alpha=0.5, beta=0.3,
)
