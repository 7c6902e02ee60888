"""Run in the training env by tests: load an XTuner config the way `xtuner
train` does and report, as JSON on the last stdout line, what it builds.

  python inspect_config.py CONFIG settings   -> a few settings, nothing built
  python inspect_config.py CONFIG raw        -> the records before tokenising
  python inspect_config.py CONFIG tokenized  -> per sample, the decoded runs of
                                                trained tokens and token counts
Settings come from the environment, as for a real run.
"""
import json
import sys

from mmengine.config import Config
from xtuner.registry import BUILDER


def trained_runs(input_ids: list[int], labels: list[int], tokenizer) -> list[str]:
    """Decoded maximal runs of tokens whose label is not -100."""
    runs, cur = [], []
    for tok, lab in zip(input_ids, labels):
        if lab != -100:
            assert lab == tok, "a trained label must be its own input token"
            cur.append(tok)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tokenizer.decode(r) for r in runs]


def main() -> None:
    path, what = sys.argv[1], sys.argv[2]
    cfg = Config.fromfile(path)
    ds_cfg = cfg.train_dataloader.dataset
    out: dict = {"optim_wrapper": str(cfg.optim_wrapper.type), "max_length": cfg.max_length,
                 "lr": cfg.lr, "max_epochs": cfg.max_epochs,
                 "accumulative_counts": cfg.optim_wrapper.accumulative_counts}
    if what == "settings":
        pass
    elif what == "raw":
        out["records"] = BUILDER.build(ds_cfg.dataset).to_list()
    else:
        dataset = BUILDER.build(ds_cfg)
        tokenizer = BUILDER.build(cfg.tokenizer)
        out["samples"] = [{"runs": trained_runs(s["input_ids"], s["labels"], tokenizer),
                           "tokens": len(s["input_ids"]),
                           "ignored": sum(1 for x in s["labels"] if x == -100),
                           "bos_first": s["input_ids"][0] == tokenizer.bos_token_id}
                          for s in dataset]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
