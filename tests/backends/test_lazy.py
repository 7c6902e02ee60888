"""LazyBackend: the model is loaded only when some work needs it, once, and
closed only if it was loaded; meanwhile it stands in for a Backend."""
from __future__ import annotations

from agent_r.driver import DriverConfig, generate_checked, run_jobs
from agent_r.llm import Backend, GenerationRequest, LazyBackend, SamplingConfig
from agent_r.manifest import write_manifest
from tests.backends.common import GREEDY, SAMPLED, numbered_chat
from tests.support.doubles import ScriptedBackend


class _Counted:
    """The ``make`` of a LazyBackend, counting what it built and what was closed."""

    def __init__(self):
        self.built: list[ScriptedBackend] = []
        self.closed = 0

    def __call__(self) -> ScriptedBackend:
        backend = ScriptedBackend(lambda messages, i, seed: f"Action: step {i}")
        backend.context_limit = 10_000
        real_close = backend.close

        def close():
            self.closed += 1
            real_close()

        backend.close = close
        self.built.append(backend)
        return backend


class _Done:
    """A driver job whose work was already done (a resumed run): it asks nothing."""

    key = "done"

    def run(self, client):
        return "kept"
        yield  # a generator that never yields


def test_nothing_generated_never_builds(tmp_path):
    """A run that generates nothing (every job already done) never builds the
    model, even though it reads the backend for its summary and manifest:
    stats are zeros, the manifest says no backend, close closes nothing."""
    make = _Counted()
    lazy = LazyBackend(make)
    done = []
    stats = run_jobs([_Done(), _Done()], lazy, lambda: object(), DriverConfig(GREEDY, 4096, concurrency=2),
                     done.append)
    assert [o.result for o in done] == ["kept", "kept"] and stats.model_calls == 0
    assert lazy.stats.as_dict() == {"calls": 0, "requests": 0, "samples": 0, "retries": 0}
    assert not lazy.loaded and make.built == []
    manifest = write_manifest(tmp_path / "manifest.json", {}, lazy, lazy.stats.as_dict(), 0.0, 1.0)
    assert manifest["backend"] == {"backend": None}
    assert lazy.startup_line() == "backend not loaded" and lazy.name == "not loaded"
    lazy.close()
    assert make.built == [] and make.closed == 0 and not lazy.loaded


def test_builds_once_and_stands_in_for_the_backend():
    """The first call that needs the model builds it; every later call, in
    any number of driver rounds, uses that one; what a run reads (stats,
    describe, context limit) is then the real backend's."""
    make = _Counted()
    lazy = LazyBackend(make)
    assert isinstance(lazy, Backend)
    out = generate_checked(lazy, [GenerationRequest(numbered_chat(0), n=2)], SAMPLED, max_token_length=4096)
    assert out == [["Action: step 0", "Action: step 1"]] and lazy.loaded

    class TwoTurns:
        key = "two"

        def run(self, client):
            first = yield GenerationRequest(numbered_chat(1))
            second = yield GenerationRequest(numbered_chat(2))
            return first + second

    stats = run_jobs([TwoTurns()], lazy, lambda: object(), DriverConfig(SAMPLED, 4096, concurrency=1),
                     lambda outcome: None)
    assert stats.model_calls == 2
    assert lazy.count_tokens(numbered_chat(0)) > 0 and lazy.context_limit == 10_000
    assert len(make.built) == 1
    real = make.built[0]
    assert lazy.get() is real and lazy.stats is real.stats and real.stats.calls == 3
    assert lazy.describe() == real.describe() == {"backend": "scripted"} and lazy.name == "scripted"


def test_close_closes_only_what_was_made():
    """close before any use builds and closes nothing; after use it closes
    the built backend once; a second close does not close it again."""
    make = _Counted()
    lazy = LazyBackend(make)
    lazy.close()
    assert make.built == [] and make.closed == 0
    lazy.generate([GenerationRequest(numbered_chat(0))], SamplingConfig())
    lazy.close()
    lazy.close()
    assert len(make.built) == 1 and make.closed == 1 and not lazy.loaded
