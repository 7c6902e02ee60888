"""WebShop: buy a product matching an instruction. Scores in [0, 1] at "buy now".
Only AgentGym's server exists (its product data cannot ship); the bundled
lists are the paper's."""
from agent_r.envs.spec import AGENTGYM, EnvSpec, Split
from agentenv_client import WebshopEnvClient

GOALS = 12087

WEBSHOP = EnvSpec(
    name="webshop", default_server="http://127.0.0.1:36003", data_len=GOALS, client_class=WebshopEnvClient,
    splits=(
        Split("agenteval", test="webshop_agenteval_test.json", train="webshop_agenteval_train.json",
              servers=(AGENTGYM,), tasks=GOALS, about="the paper's AgentEval lists: 200 test, 3,930 train ids"),
    ),
    max_score=1.0, max_depth=10, alpha=0.5, beta=0.3,
)
