"""TextCraft: craft a Minecraft item from recipes. Scores 0/1.

Both servers order the 544 goals by recipe depth; within a depth AgentGym's
follows its directory listing and ours the item id. So AgentEval's ids mean
the paper's goals only on AgentGym's server (default there), and the project
split is the default on ours (the bundled model was trained on its train
list); each can be chosen by name on the other with a warning."""
from agent_r.envs.spec import AGENT_R, AGENTGYM, EnvSpec, Split
from agentenv_client import TextCraftEnvClient

GOALS = 544

TEXTCRAFT = EnvSpec(
    name="textcraft", default_server="http://127.0.0.1:36001", data_len=GOALS, client_class=TextCraftEnvClient,
    splits=(
        Split("agenteval", test="textcraft_agenteval_test.json", train="textcraft_agenteval_train.json",
              servers=(AGENTGYM,), tasks=GOALS, about="the paper's AgentEval lists: 100 test, 374 train ids"),
        Split("project", test="textcraft_test.json", train="textcraft_train.json", servers=(AGENT_R,), tasks=GOALS,
              about="every 5th goal below 500 as test (100), the other 444 as train"),
    ),
    max_score=1.0, max_depth=20, alpha=0.5, beta=0.5, goal_pattern=r"Goal:\s*craft\s+([^.\n]+)",
    refusal_pattern=r"Could not ",   # execute ..., find ..., find enough items to craft ..., find a valid recipe ...
)
