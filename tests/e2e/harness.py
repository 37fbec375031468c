"""Run elastic tensorplay or torch jobs as separate agent processes, as pods would run them.

Each agent is ``python -m kube_rendezvous.run`` (tensorplay's launcher with ``k8s``
registered) or stock ``torchrun`` (``launcher="torchrun"``: torch's own launcher, which finds
``k8s`` through its entry point) in its own process session, with its own log file. ``kill_pod`` plays a pod's
death: the agent and every worker it started are SIGKILLed together (the workers run in
their own sessions, so a process-group kill would miss them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.testenv import wait_until

REPO = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = REPO / "tests" / "e2e" / "train.py"
TORCH_TRAIN_SCRIPT = REPO / "tests" / "e2e" / "train_torch.py"
#: The torchrun console script of this environment (pip installs it beside the interpreter).
TORCHRUN = Path(sys.executable).parent / "torchrun"
#: Seconds the tests give started agents to train together: the rendezvous, the workers' start and a step.
TRAINING_SECONDS = 120


@dataclass
class Agent:
    """One launcher process (a pod) and its log."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        """SIGTERM the agent process only, as the kubelet does to a pod's PID 1 on a drain or preemption."""
        self.process.send_signal(signal.SIGTERM)

    @property
    def node_name(self) -> str:
        """The rendezvous node name of this agent (``addr_pid_localid``) now, from its log: the last one it logged
        (a live agent that was evicted joins again under a new name)."""
        found = NODE_LINE.findall(self.output())
        if not found:
            raise AssertionError(f"{self.name} has not logged its rendezvous node yet")
        return next(name for name in found[-1] if name)

    def kill_pod(self) -> None:
        """SIGKILL the agent and all its descendants at once, as a pod's death does."""
        kill_pods([self])


def kill_pods(agents: list[Agent]) -> None:
    """SIGKILL every process of ``agents`` before waiting for any, as a machine's death does.

    Killing one agent and then, after its processes were reaped, the next would let the next
    agent's workers see their peers gone and its agent leave the rendezvous before it dies.
    """
    trees: list[psutil.Process] = []
    for agent in agents:
        try:
            root = psutil.Process(agent.process.pid)
            trees += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    for process in trees:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(trees, timeout=10)
    for agent in agents:
        agent.process.wait(10)


@dataclass
class ElasticJob:
    """A set of agents of one job sharing a result directory."""

    workdir: Path
    backend: str
    endpoint: str
    nnodes: str
    rdzv_conf: dict[str, str] = field(default_factory=dict)
    run_id: str = "none"
    nproc_per_node: int = 2
    steps: int = 3
    step_seconds: float = 0.0
    max_restarts: int = 3
    launcher: str = "tensorplay"
    #: torchrun only: select the backend with PET_RDZV_BACKEND/ENDPOINT/ID instead of flags.
    select_by_environment: bool = False
    #: The training script; None: the launcher's test script (``train_torch.py`` or ``train.py``).
    script: Path | None = None
    agents: list[Agent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.result_dir = self.workdir / "results"
        self.result_dir.mkdir(parents=True, exist_ok=True)

    def command(self, local_addr: str = "127.0.0.1") -> list[str]:
        conf = ",".join(f"{key}={value}" for key, value in self.rdzv_conf.items())
        launcher = [str(TORCHRUN)] if self.launcher == "torchrun" else [sys.executable, "-m", "kube_rendezvous.run"]
        script = self.script or (TORCH_TRAIN_SCRIPT if self.launcher == "torchrun" else TRAIN_SCRIPT)
        rendezvous = [
            f"--rdzv-backend={self.backend}",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={self.run_id}",
        ]
        return [
            *launcher,
            f"--nnodes={self.nnodes}",
            f"--nproc-per-node={self.nproc_per_node}",
            *([] if self.select_by_environment else rendezvous),
            *([f"--rdzv-conf={conf}"] if conf else []),
            f"--max-restarts={self.max_restarts}",
            "--monitor-interval=0.5",
            f"--local-addr={local_addr}",
            str(script),
        ]

    def start_agent(
        self,
        name: str | None = None,
        local_addr: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        pod: Any = None,
    ) -> Agent:
        """Start one agent (a pod) named ``name``, with ``env`` added to its environment (its workers inherit it).

        With ``pod`` (a ``tests.testenv.podnet.Pod``) it runs in that pod's network namespace, with the
        pod's address as its ``--local-addr`` and ``POD_IP``.
        """
        name = name or f"agent-{len(self.agents)}"
        if pod is not None:
            local_addr = pod.address
        log = self.workdir / f"{name}.log"
        extra = dict(env or {})
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            LOGLEVEL="INFO",
            RESULT_DIR=str(self.result_dir),
            STEPS=str(self.steps),
            STEP_SECONDS=str(self.step_seconds),
        )
        env.update(extra)
        if self.select_by_environment:
            env.update(PET_RDZV_BACKEND=self.backend, PET_RDZV_ENDPOINT=self.endpoint, PET_RDZV_ID=self.run_id)
        if pod is not None:
            env.update(pod.environment())
        command = self.command(local_addr)
        with log.open("wb") as handle:
            process = subprocess.Popen(
                pod.command(command) if pod is not None else command,
                cwd=self.workdir,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        agent = Agent(name, process, log)
        self.agents.append(agent)
        return agent

    def start(self, agents: int | Sequence[str]) -> list[Agent]:
        """Start agents: ``agents`` of them (``agent-N``), or one per pod address given (``trainer-N``, its
        ``--local-addr``), as the tests name the pods they create for them."""
        if isinstance(agents, int):
            return [self.start_agent() for _ in range(agents)]
        return [self.start_agent(f"trainer-{index}", local_addr=address) for index, address in enumerate(agents)]

    def wait_training(
        self,
        agents: list[Agent],
        world_size: int | None = None,
        *,
        min_step: int = 1,
        timeout: float = TRAINING_SECONDS,
        what: str = "",
    ) -> dict[int, Agent]:
        """Wait until every one of ``agents`` trains in a world of ``world_size`` (default: theirs,
        ``nproc_per_node`` workers each) past ``min_step``; return group rank -> agent.

        Raises TimeoutError naming ``what`` with each agent's last lines after ``timeout`` seconds."""
        world = self.nproc_per_node * len(agents) if world_size is None else world_size
        found: dict[int, Agent] = wait_until(
            lambda: training_in_world(agents, world, min_step),
            timeout,
            what or f"{len(agents)} {self.launcher} agents ({self.backend}) training in a world of {world}",
            explain=self.last_lines,
        )
        return found

    def start_training(
        self, agents: int | Sequence[str], *, timeout: float = TRAINING_SECONDS, what: str = ""
    ) -> list[Agent]:
        """``start`` the agents, then ``wait_training`` until they all train together past step 1."""
        started = self.start(agents)
        self.wait_training(started, timeout=timeout, what=what)
        return started

    def agent_with_group_rank(self, group_rank: int, restart: int = 0) -> Agent | None:
        """The agent whose workers printed ``group_rank N restart R``, if any did yet."""
        marker = f"group_rank {group_rank} restart {restart} "
        return next((agent for agent in self.agents if marker in agent.output()), None)

    def results(self) -> list[dict[str, Any]]:
        """Every worker's result, of every round that finished."""
        return [json.loads(path.read_text()) for path in sorted(self.result_dir.glob("result-*.json"))]

    def last_results(self) -> list[dict[str, Any]]:
        """Results of the round that finished last (its workers share one bootstrap address)."""
        found = self.results()
        if not found:
            return []
        last = max(found, key=lambda item: item["finished_at"])["master"]
        return [item for item in found if item["master"] == last]

    def wait(self, agents: list[Agent], timeout: float) -> list[int]:
        """Wait for ``agents`` to exit; return their exit codes. Raises TimeoutError with their logs."""
        deadline = time.monotonic() + timeout
        for agent in agents:
            try:
                agent.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                tails = "\n".join(f"--- {a.name}\n{a.output()[-4000:]}" for a in agents)
                raise TimeoutError(f"agents still running after {timeout:.0f} s:\n{tails}") from None
        return [agent.process.returncode for agent in agents]

    def stop(self) -> None:
        """Kill every agent still running (test teardown)."""
        kill_pods([agent for agent in self.agents if agent.alive()])

    def logs(self) -> str:
        """The end of every agent's output, without the launcher's configuration and result dumps."""
        return "\n".join(f"--- {agent.name}\n{quiet(agent.output())[-6000:]}" for agent in self.agents)

    def last_lines(self, count: int = 15) -> str:
        """The last ``count`` lines of every agent's output (``wait_until``'s ``explain``: what each was doing)."""
        return "\n".join(
            f"--- {agent.name}{'' if agent.alive() else ' (exited)'}\n"
            + "\n".join(quiet(agent.output()).splitlines()[-count:])
            for agent in self.agents
        )


#: Lines of torch's launcher that repeat its configuration, dropped so that failures show what happened.
NOISE_LINE = re.compile(r"launcher/api\.py:\d+\]  |agent/server/api\.py:552\]  ")


def quiet(output: str) -> str:
    """``output`` without the launcher's configuration and per-round result dumps."""
    return "\n".join(line for line in output.splitlines() if not NOISE_LINE.search(line))


#: Our handlers log "this agent is rendezvous node N"; torch's logs "The node 'N' attempts to join".
NODE_LINE = re.compile(
    r"this agent is rendezvous node (\S+)|joins again as node (\S+)|The node '([^']+)' attempts to join"
)
STEP_LINE = re.compile(r"rank (\d+)/(\d+) group_rank (\d+) restart (\d+) step (\d+)")
INIT_LINE = re.compile(r"group_rank (\d+) restart (\d+): init_process_group world (\d+)")


def entering_init(agent: Agent, world_size: int, restart: int = 0) -> int:
    """How many of ``agent``'s workers announced ``init_process_group`` for a world of ``world_size``."""
    found = INIT_LINE.findall(agent.output())
    return sum(1 for _, seen_restart, world in found if (int(seen_restart), int(world)) == (restart, world_size))


def training_progress(agent: Agent) -> tuple[int, int, int] | None:
    """(world_size, group_rank, step) of the last training step the agent's workers printed."""
    matches = STEP_LINE.findall(agent.output())
    if not matches:
        return None
    _, world, group, _, step = matches[-1]
    return int(world), int(group), int(step)


def training_in_world(agents: list[Agent], world_size: int, min_step: int = 1) -> dict[int, Agent] | None:
    """Map group rank -> agent once every agent trains in a world of ``world_size`` past ``min_step``."""
    found: dict[int, Agent] = {}
    for agent in agents:
        progress = training_progress(agent)
        if progress is None or progress[0] != world_size or progress[2] < min_step:
            return None
        found[progress[1]] = agent
    return found
