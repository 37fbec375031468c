"""A generated lifecycle test: random sequences of what users and clusters do to jobs, on the real control plane.

One Rendezvous name, runs of real tensorplay agents (processes with a training pod's ServiceAccount token) started
under it one after the other (a re-run under the same name, each with its own ``--rdzv-id``), and between them
the actions of ``ACTIONS``: a person's close, a deletion, SIGKILL or SIGTERM of an agent, an eviction of a live
agent by mistake, a partition of one agent from the API server and its heal (each agent talks to the API server
through its own fault proxy), the operator stopped and started. ``Lifecycle.step`` applies one action and waits
for what the README says follows; ``Lifecycle.check`` asserts the invariants after every step:

- no agent exits 0 unless its own run trained to its end, or a person closed or deleted its own run;
- a run that was started trains within ``TRAIN_SECONDS`` (nobody is left waiting past its join timeout);
- a Rendezvous deleted is gone within ``DELETE_SECONDS``, with or without the operator;
- one event breaks the round at most once (an eviction or a healed partition re-forms one round, not many; the
  agent put out rejoins as a new member);
- the operator keeps nothing of a Rendezvous that is gone (its ``tracked`` gauge).

``run_sequence`` draws a sequence from a seed; a failure names the seed and the steps, and ``shrink`` removes steps
one at a time while the failure stays, so the report ends with a short reproduction.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.e2e.harness import Agent, ElasticJob, kill_pods, training_in_world
from tests.e2e.operator_process import OperatorProcess
from tests.faultproxy import FaultProxy, proxy_kubeconfig
from tests.testenv import ControlPlane, wait_until
from tests.testenv.commands import run_command

GROUP, VERSION, PLURAL = "kube-rendezvous.io", "v1alpha1", "rendezvouses"
#: Agents per run (``--nnodes=1:AGENTS``, 2 workers each).
AGENTS = 2
#: Seconds a started run may take to train (its join timeout is longer: the run must not wait that long).
TRAIN_SECONDS = 90.0
#: Seconds a deletion may take, with or without the operator.
DELETE_SECONDS = 30.0
#: Seconds the agents of an ended run may take to exit.
EXIT_SECONDS = 60.0
#: What users and clusters do; each is drawn only where the model allows it (``Lifecycle.allowed``).
#: The operator's gauge of the Rendezvous it keeps anything of (it must drop a deleted one whole).
TRACKED_METRIC = "kube_rendezvous_operator_tracked_rendezvous"
ACTIONS = (
    "run",
    "close",
    "delete",
    "ttl",
    "sigkill",
    "sigkill_all",
    "sigterm",
    "evict_live",
    "partition",
    "operator_stop",
    "operator_start",
)


@dataclass
class Run:
    """One run of the job: its agents and how it ended (as the model knows it)."""

    run_id: str
    job: ElasticJob
    #: How a person ended it ("close", "delete"), None while it runs.
    ended_by: str | None = None
    #: Agents that a fault took away (SIGKILL, SIGTERM): they never count as exiting 0 wrongly.
    faulted: list[Agent] = field(default_factory=list)

    @property
    def live(self) -> list[Agent]:
        return [agent for agent in self.job.agents if agent.alive() and agent not in self.faulted]


@dataclass
class Lifecycle:
    """The model and the real thing side by side: one Rendezvous name in ``namespace``."""

    plane: ControlPlane
    objects: client.CustomObjectsApi
    namespace: str
    name: str
    #: The agents' kubeconfig (a training pod's ServiceAccount) and the operator's.
    kubeconfig: Path
    operator_kubeconfig: Path
    workdir: Path
    runs: list[Run] = field(default_factory=list)
    operator_running: OperatorProcess | None = None
    log: list[str] = field(default_factory=list)
    #: Each agent's own fault proxy to the API server, by (run id, agent name).
    proxies: dict[tuple[str, str], FaultProxy] = field(default_factory=dict)

    @property
    def current(self) -> Run | None:
        return self.runs[-1] if self.runs and self.runs[-1].ended_by is None and self.runs[-1].live else None

    def allowed(self, action: str) -> bool:
        current = self.current
        if action == "run":
            return current is None
        if action in ("close", "delete", "sigkill_all"):
            return current is not None
        if action == "ttl":
            return current is None and bool(self.runs) and self.runs[-1].ended_by == "close"
        if action in ("sigkill", "sigterm", "evict_live", "partition"):
            return current is not None and len(current.live) >= 2
        if action == "operator_stop":
            return self.operator_running is not None
        if action == "operator_start":
            return self.operator_running is None
        raise ValueError(action)

    # -- the actions -----------------------------------------------------------------------

    def step(self, action: str) -> None:
        self.log.append(action)
        getattr(self, f"do_{action}")()
        self.check()

    def do_run(self) -> None:
        run_id = f"run-{len(self.runs)}"
        job = ElasticJob(
            self.workdir / f"{self.name}-{run_id}",
            "k8s",
            f"{self.namespace}/{self.name}",
            nnodes=f"1:{AGENTS}",
            run_id=run_id,
            steps=100000,
            step_seconds=0.2,
            # A 6 s heartbeat expiry (2 s keep-alive x 3): what is killed counts as dead sooner, and CI waits less.
            rdzv_conf={  # the kubeconfig: each agent's own, through its fault proxy (``KUBECONFIG``)
                "last_call_timeout": "2",
                "join_timeout": "600",
                "keep_alive_interval": "2",
            },
        )
        run = Run(run_id, job)
        self.runs.append(run)
        agents = [
            job.start_agent(env={"KUBECONFIG": str(self._proxied(run_id, f"agent-{index}"))}) for index in range(AGENTS)
        ]
        wait_until(
            lambda: training_in_world(agents, 2 * AGENTS),
            TRAIN_SECONDS,
            f"{run_id} training with {AGENTS} agents",
            explain=lambda: self.explain(job),
        )

    def do_close(self) -> None:
        run = self._current()
        self.kubectl("patch", "rdzv", self.name, "--type=merge", "-p", '{"spec":{"closed":true}}')
        run.ended_by = "close"
        self._exited_cleanly(run)

    def do_delete(self) -> None:
        run = self._current()
        self.kubectl("delete", "rdzv", self.name, "--wait=false")
        run.ended_by = "delete"
        wait_until(lambda: self.rendezvous() is None, DELETE_SECONDS, f"Rendezvous {self.name} deleted")
        self._exited_cleanly(run)

    def do_ttl(self) -> None:
        self.kubectl("patch", "rdzv", self.name, "--type=merge", "-p", '{"spec":{"ttlSecondsAfterClosed":2}}')
        self.runs[-1].ended_by = "close+ttl"

    def do_sigkill_all(self) -> None:
        run = self._current()
        victims = run.live
        run.faulted.extend(victims)
        kill_pods(victims)

    def do_sigkill(self) -> None:
        run = self._current()
        victim, survivors = run.live[0], run.live[1:]
        run.faulted.append(victim)
        kill_pods([victim])
        self._trains(run, survivors, "after a SIGKILL")

    def do_sigterm(self) -> None:
        run = self._current()
        victim, survivors = run.live[0], run.live[1:]
        run.faulted.append(victim)
        victim.terminate()
        victim.process.wait(EXIT_SECONDS)
        self._trains(run, survivors, "after a SIGTERM")

    def do_evict_live(self) -> None:
        run = self._current()
        victim = run.live[-1]
        before = {agent.name: agent.output().count(" formed") for agent in run.live}
        plugin = str(Path(sys.executable).parent / "kubectl-rdzv")
        kubeconfig = str(self.plane.admin_kubeconfig)
        command = [plugin, "--kubeconfig", kubeconfig, "-n", self.namespace, "evict", self.name, victim.node_name]
        run_command(command, timeout=60)
        if self.operator_running is None:
            return  # nothing folds an intent while every agent trains: it takes effect at the next fold
        wait_until(
            lambda: all(agent.output().count(" formed") > before[agent.name] for agent in run.live),
            TRAIN_SECONDS,
            "the round to re-form after the eviction",
            explain=lambda: self.explain(run.job),
        )
        self._trains(run, run.live, "after an eviction of a live agent")
        after = {agent.name: agent.output().count(" formed") for agent in run.live}
        broken = {name: after[name] - before[name] for name in after}
        assert all(count <= 2 for count in broken.values()), f"one eviction broke the round {broken} times"

    def do_partition(self) -> None:
        """One live agent cut off from the API server (its watches closed, its requests unanswered) until the others
        train without it, longer than its heartbeat expiry; then the partition heals. The healed agent finds it
        was put out of the round, rejoins as a new member, and all train together again: its round breaks once
        for the partition and once for its return, not round after round."""
        run = self._current()
        victim, survivors = run.live[-1], run.live[:-1]
        before = {agent.name: agent.output().count(" formed") for agent in run.live}
        proxy = self.proxies[(run.run_id, victim.name)]
        proxy.partition()
        try:
            self._trains(run, survivors, f"while {victim.name} is partitioned from the API server")
        finally:
            proxy.heal()
        assert victim.alive(), f"{victim.name} exited after a partition that healed:\n{victim.output()[-3000:]}"
        self._trains(run, run.live, f"with {victim.name} again after the partition healed")
        after = {agent.name: agent.output().count(" formed") for agent in run.live}
        broken = {name: after[name] - before[name] for name in after}
        assert all(count <= 2 for count in broken.values()), f"one healed partition re-formed the round {broken} times"

    def do_operator_stop(self) -> None:
        assert self.operator_running is not None
        self.operator_running.stop()
        self.operator_running = None

    def do_operator_start(self) -> None:
        log = self.workdir / f"operator-{len(self.log)}.log"
        self.operator_running = OperatorProcess(self.operator_kubeconfig, self.namespace, log)
        self.operator_running.start()

    # -- the invariants --------------------------------------------------------------------

    def check(self) -> None:
        for run in self.runs:
            for agent in run.job.agents:
                if agent.alive() or agent in run.faulted or agent.process.returncode != 0:
                    continue
                output = agent.output()
                finished = "finished: this agent's workers succeeded" in output
                closed = run.ended_by is not None and "ended, this agent stops and exits 0" in output
                assert finished or closed, (
                    f"{run.run_id}/{agent.name} exited 0 without its run ending:\n{output[-3000:]}"
                )
        operator = self.operator_running
        if operator is not None:
            listed = self.objects.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
            present = len(listed["items"])  # type: ignore[index]
            wait_until(
                lambda: operator.metric(TRACKED_METRIC) <= present,
                30,
                f"the operator to track at most the {present} Rendezvous that exist",
            )

    # -- helpers ---------------------------------------------------------------------------

    def _current(self) -> Run:
        run = self.current
        assert run is not None
        return run

    def _exited_cleanly(self, run: Run) -> None:
        agents = run.live
        codes = run.job.wait(agents, EXIT_SECONDS)
        assert codes == [0] * len(agents), f"{run.run_id} after {run.ended_by}: exit codes {codes}\n{run.job.logs()}"

    def _trains(self, run: Run, agents: list[Agent], what: str) -> None:
        wait_until(
            lambda: (
                training_in_world(agents, 2 * len(agents), min_step=0)
                and all(agent.output().rsplit(" formed", 1)[-1].count(" step ") >= 2 for agent in agents)
            ),
            TRAIN_SECONDS,
            f"{run.run_id} training again {what}",
            explain=lambda: self.explain(run.job),
        )

    def explain(self, job: ElasticJob) -> str:
        """What a failing wait shows: the agents' last lines, and ``kubectl rdzv status`` of the object (its round,
        members, Leases and what the round waits for), as the on-call engineer would read it."""
        plugin = str(Path(sys.executable).parent / "kubectl-rdzv")
        kubeconfig = str(self.plane.admin_kubeconfig)
        status = run_command(
            [plugin, "--kubeconfig", kubeconfig, "-n", self.namespace, "status", self.name], check=False, timeout=60
        )
        return f"{job.last_lines()}\n--- kubectl rdzv status {self.name} ---\n{status.stdout}{status.stderr}"

    def kubectl(self, *args: str) -> None:
        self.plane.kubectl("-n", self.namespace, *args)

    def rendezvous(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.objects.get_namespaced_custom_object(  # type: ignore[assignment]
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def _proxied(self, run_id: str, agent: str) -> Path:
        """A kubeconfig of the agents' account through a new fault proxy of its own (kept in ``proxies``)."""
        directory = self.workdir / f"proxy-{run_id}-{agent}"
        proxy = FaultProxy(self.plane.server, self.plane.pki.ca_cert, self.plane.pki.ca_key, directory).start()
        self.proxies[(run_id, agent)] = proxy
        return proxy_kubeconfig(self.kubeconfig, proxy.url, directory / "kubeconfig")

    def stop(self) -> None:
        for run in self.runs:
            run.job.stop()
        if self.operator_running is not None:
            self.operator_running.stop()
            self.operator_running = None
        for proxy in self.proxies.values():
            proxy.stop()
        errors = [error for proxy in self.proxies.values() for error in proxy.errors]
        assert errors == [], f"a fault proxy itself failed: {errors}"


def draw(seed: int, length: int) -> list[str]:
    """A sequence of ``length`` actions from ``seed`` that the model allows, played on the model alone."""
    rng = random.Random(seed)
    model = _Model()
    sequence: list[str] = []
    while len(sequence) < length:
        action = rng.choice([action for action in ACTIONS if model.allowed(action)])
        model.apply(action)
        sequence.append(action)
    return sequence


@dataclass
class _Model:
    """What ``Lifecycle.allowed`` knows, without the real thing: is a run live, how many agents, the operator."""

    live: int = 0
    operator: bool = False
    #: How the last run ended: "close" (its object stays, closed), "ttl" (a TTL set on it), else "".
    last_end: str = ""

    def allowed(self, action: str) -> bool:
        return {
            "run": self.live == 0,
            "close": self.live > 0,
            "delete": self.live > 0,
            "sigkill_all": self.live > 0,
            "ttl": self.live == 0 and self.last_end == "close",
            "sigkill": self.live >= 2,
            "sigterm": self.live >= 2,
            "evict_live": self.live >= 2,
            "partition": self.live >= 2,
            "operator_stop": self.operator,
            "operator_start": not self.operator,
        }[action]

    def apply(self, action: str) -> None:
        if action == "run":
            self.live, self.last_end = AGENTS, ""
        elif action in ("close", "delete", "sigkill_all"):
            self.live, self.last_end = 0, "close" if action == "close" else ""
        elif action == "ttl":
            self.last_end = "ttl"
        elif action in ("sigkill", "sigterm"):
            self.live -= 1
        elif action == "operator_stop":
            self.operator = False
        elif action == "operator_start":
            self.operator = True


def valid(sequence: list[str]) -> bool:
    model = _Model()
    for action in sequence:
        if not model.allowed(action):
            return False
        model.apply(action)
    return True


def play(make: Callable[[int], Lifecycle], sequence: list[str], attempt: int) -> BaseException | None:
    """Play ``sequence`` on a fresh Lifecycle (``make(attempt)``); the failure, or None."""
    lifecycle = make(attempt)
    try:
        for action in sequence:
            lifecycle.step(action)
    except (AssertionError, TimeoutError) as exc:
        return exc
    finally:
        lifecycle.stop()
    return None


def shrink(make: Callable[[int], Lifecycle], sequence: list[str], failure: BaseException) -> list[str]:
    """Remove steps one at a time while the sequence stays valid and still fails; the shortest found."""
    attempt = 1
    index = len(sequence) - 1
    while index >= 0:
        shorter = sequence[:index] + sequence[index + 1 :]
        if shorter and valid(shorter):
            attempt += 1
            if play(make, shorter, attempt) is not None:
                sequence = shorter
        index -= 1
    return sequence


def report(seed: int, sequence: list[str], failure: BaseException, shrunk: list[str]) -> str:
    return json.dumps(
        {"seed": seed, "sequence": sequence, "shortest_failing": shrunk, "failure": str(failure)[:4000]}, indent=1
    )


def run_sequence(make: Callable[[int], Lifecycle], seed: int, length: int) -> tuple[list[str], float]:
    """Play the sequence of ``seed``; on failure shrink it and raise an AssertionError with the reproduction."""
    sequence = draw(seed, length)
    started = time.monotonic()
    failure = play(make, sequence, 0)
    if failure is None:
        return sequence, time.monotonic() - started
    shrunk = shrink(make, sequence, failure)
    raise AssertionError(f"lifecycle sequence failed:\n{report(seed, sequence, failure, shrunk)}") from failure
