"""The chart's alerts, evaluated by Prometheus's own rule engine: ``promtool check rules`` and ``promtool test rules``.

The PrometheusRule is rendered with helm (``metrics.prometheusRule.enabled``), its ``spec.groups`` written as a rules
file, and each scenario below written as a promtool unit test: series as the ServiceMonitor scrapes them from the
operator (``honorLabels``: a Rendezvous's own ``namespace`` and ``name``; the target's ``namespace``, the release's,
on the operator's own metrics) and, at one evaluation time, the alerts expected of EVERY rule of the file: a rule a
scenario does not name must be silent. Each alert has a scenario it fires in, with its labels and annotations, and
the healthy scenarios are silent for all of them. promtool is Debian bookworm's Prometheus 2.42
(``tests/testenv/binaries.py``): the rules must be valid for that release.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_chart import RELEASE_NAMESPACE, Helm, the
from tests.testenv import ensure_binaries

#: How long promtool may take for one file (it takes well under a second).
PROMTOOL_TIMEOUT = 60
#: The scrape interval of the scenarios, and the rules' evaluation interval.
INTERVAL = "1m"
#: When the scenarios are evaluated: 40 one-minute samples in, past every alert's ``for`` and window.
EVAL_TIME = "40m"
SAMPLES = 41
OPERATOR = "rdzv-kube-rendezvous-operator"
#: The labels the scrape puts on every series (the Rendezvous's namespace wins on its own series: honorLabels).
TARGET = f'job="{OPERATOR}",instance="10.0.0.5:9090",pod="{OPERATOR}-7d4b9-x2k8f"'
RDZV = 'namespace="team-a",name="llama"'
#: Another release's operator (rbac.scope=namespace in another namespace): its troubles are not this release's.
OTHER = 'namespace="team-ops",job="other-operator",instance="10.0.0.9:9090"'


def constant(value: float) -> str:
    return f"{value:g}x{SAMPLES - 1}"


def appearing_at(minute: int, values: str) -> str:
    """No sample before ``minute`` (a series that did not exist yet), then ``values``."""
    return f"_x{minute} {values}" if minute else values


def per_rendezvous(metric: str, extra: str = "") -> str:
    return f"{metric}{{{RDZV},{TARGET}{',' + extra if extra else ''}}}"


def phases(current: str, since: int = 0) -> dict[str, str]:
    """The ``kube_rendezvous_phase`` series of one Rendezvous in phase ``current`` from minute ``since`` on."""
    names = ("Pending", "Joining", "LastCall", "Complete", "Closed")
    return {
        f'kube_rendezvous_phase{{{RDZV},{TARGET},phase="{name}"}}': appearing_at(
            since, f"{1 if name == current else 0}x{SAMPLES - 1 - since}"
        )
        for name in names
    }


#: A healthy installation: one Rendezvous that formed round 3 long ago, two operator replicas (one leads), an old
#: eviction and an old invalid state, long over; and another release's operator that fails and has no leader.
HEALTHY: dict[str, str] = {
    per_rendezvous("kube_rendezvous_round"): constant(3),
    per_rendezvous("kube_rendezvous_waiting_nodes"): constant(0),
    per_rendezvous("kube_rendezvous_participants"): constant(8),
    **phases("Complete"),
    per_rendezvous("kube_rendezvous_node_evictions_total"): constant(2),
    per_rendezvous("kube_rendezvous_events_total", 'reason="StateInvalid"'): constant(1),
    per_rendezvous("kube_rendezvous_events_total", 'reason="RoundCompleted"'): "0+1x3 3x36",
    f'kube_rendezvous_reconcile_errors_total{{namespace="{RELEASE_NAMESPACE}",{TARGET},handler="evict"}}': constant(1),
    f'kube_rendezvous_operator_write_conflicts_total{{namespace="{RELEASE_NAMESPACE}",{TARGET}}}': constant(0),
    f'kube_rendezvous_operator_leader{{namespace="{RELEASE_NAMESPACE}",{TARGET}}}': constant(1),
    f'kube_rendezvous_operator_leader{{namespace="{RELEASE_NAMESPACE}",job="{OPERATOR}",instance="10.0.0.6:9090"}}': (
        constant(0)
    ),
    f'kube_rendezvous_reconcile_errors_total{{{OTHER},handler="conditions"}}': f"0+1x{SAMPLES - 1}",
    f"kube_rendezvous_operator_write_conflicts_total{{{OTHER}}}": constant(0),
    f"kube_rendezvous_operator_leader{{{OTHER}}}": constant(0),
}


@dataclass(frozen=True)
class Alert:
    """An alert expected at ``EVAL_TIME``: its labels (``severity`` and the grouping labels) and its summary."""

    labels: dict[str, str]
    summary: str
    value: str = ""


@dataclass(frozen=True)
class Scenario:
    """The series of ``HEALTHY`` with ``changes`` (a series set to ``None`` is dropped), and the alerts that fire."""

    name: str
    changes: dict[str, str | None]
    firing: dict[str, list[Alert]] = field(default_factory=dict)

    def series(self) -> dict[str, str]:
        merged: dict[str, str | None] = {**HEALTHY, **self.changes}
        return {selector: values for selector, values in merged.items() if values is not None}


def stuck(summary_window: str = "15m") -> Alert:
    return Alert(
        {"severity": "warning", "namespace": "team-a", "name": "llama"},
        f"Rendezvous team-a/llama has had no new round for {summary_window} while nodes waited or a round formed",
    )


def flapping(first: int, second: int) -> str:
    """A phase series that alternates every minute (a round between Joining and LastCall: a node comes and goes)."""
    return " ".join(str(first if minute % 2 == 0 else second) for minute in range(SAMPLES))


SCENARIOS = [
    Scenario("healthy", {}),
    Scenario(
        # Created 10 minutes ago, still joining: it has not waited stuckJoiningFor yet (the rule once fired here,
        # one minute after creation: min_over_time saw only the young series' samples).
        "healthy-young-rendezvous-joining",
        {
            per_rendezvous("kube_rendezvous_round"): appearing_at(30, "0x10"),
            per_rendezvous("kube_rendezvous_waiting_nodes"): appearing_at(30, "2x10"),
            **phases("Joining", since=30),
        },
    ),
    Scenario(
        # Nodes waited 30 minutes, but the round changed 10 minutes ago: they got in.
        "healthy-waiting-nodes-let-in",
        {
            per_rendezvous("kube_rendezvous_round"): "3x29 4x10",
            per_rendezvous("kube_rendezvous_waiting_nodes"): "2x29 0x10",
        },
    ),
    Scenario(
        "stuck-waiting",
        {per_rendezvous("kube_rendezvous_waiting_nodes"): constant(2)},
        {"KubeRendezvousStuckJoining": [stuck()]},
    ),
    Scenario(
        "stuck-forming",
        phases("Joining"),
        {"KubeRendezvousStuckJoining": [stuck()]},
    ),
    Scenario(
        # Joining and LastCall in turn, never Complete (the rule once asked for one phase the whole window).
        "stuck-forming-between-joining-and-lastcall",
        {
            f'kube_rendezvous_phase{{{RDZV},{TARGET},phase="Joining"}}': flapping(1, 0),
            f'kube_rendezvous_phase{{{RDZV},{TARGET},phase="LastCall"}}': flapping(0, 1),
            f'kube_rendezvous_phase{{{RDZV},{TARGET},phase="Complete"}}': constant(0),
        },
        {"KubeRendezvousStuckJoining": [stuck()]},
    ),
    Scenario(
        "eviction-storm",
        {per_rendezvous("kube_rendezvous_node_evictions_total"): f"0+2x{SAMPLES - 1}"},
        {
            "KubeRendezvousEvictionStorm": [
                Alert(
                    {"severity": "warning", "namespace": "team-a", "name": "llama"},
                    "Rendezvous team-a/llama evicted 20 nodes in 10 minutes",
                    "20",
                )
            ]
        },
    ),
    Scenario(
        # The first evictions of a Rendezvous, a batch of 8: the series is born at 8 (increase() alone never
        # saw that value, and the rule missed a first storm).
        "eviction-storm-first-batch",
        {per_rendezvous("kube_rendezvous_node_evictions_total"): appearing_at(35, "8x5")},
        {
            "KubeRendezvousEvictionStorm": [
                Alert(
                    {"severity": "warning", "namespace": "team-a", "name": "llama"},
                    "Rendezvous team-a/llama evicted 8 nodes in 10 minutes",
                    "8",
                )
            ]
        },
    ),
    Scenario(
        # One invalid state, counted once (the operator counts one StateInvalid per text): the series is born at 1.
        # increase() alone never saw it, and the rule never fired on a first invalid state.
        "state-invalid",
        {per_rendezvous("kube_rendezvous_events_total", 'reason="StateInvalid"'): appearing_at(35, "1x5")},
        {
            "KubeRendezvousStateInvalid": [
                Alert(
                    {"severity": "critical", "namespace": "team-a", "name": "llama"},
                    "Rendezvous team-a/llama holds an invalid state",
                )
            ]
        },
    ),
    Scenario(
        "state-invalid-again",
        {per_rendezvous("kube_rendezvous_events_total", 'reason="StateInvalid"'): "1x34 2x5"},
        {
            "KubeRendezvousStateInvalid": [
                Alert(
                    {"severity": "critical", "namespace": "team-a", "name": "llama"},
                    "Rendezvous team-a/llama holds an invalid state",
                )
            ]
        },
    ),
    Scenario(
        "reconcile-errors",
        {
            f'kube_rendezvous_reconcile_errors_total{{namespace="{RELEASE_NAMESPACE}",{TARGET},handler="evict"}}': (
                f"0+1x{SAMPLES - 1}"
            )
        },
        {
            "KubeRendezvousReconcileErrors": [
                Alert(
                    {"severity": "warning", "handler": "evict"},
                    "The kube-rendezvous operator's evict actions keep failing",
                )
            ]
        },
    ),
    Scenario(
        # Scaled to zero 20 minutes ago: its series go stale, only the other release's operator is scraped.
        "operator-absent",
        {
            f'kube_rendezvous_operator_write_conflicts_total{{namespace="{RELEASE_NAMESPACE}",{TARGET}}}': (
                "0x20 stale"
            ),
            f'kube_rendezvous_operator_leader{{namespace="{RELEASE_NAMESPACE}",{TARGET}}}': "1x20 stale",
            f'kube_rendezvous_operator_leader{{namespace="{RELEASE_NAMESPACE}",job="{OPERATOR}",'
            'instance="10.0.0.6:9090"}': "0x20 stale",
        },
        {
            "KubeRendezvousOperatorAbsent": [
                Alert(
                    {"severity": "warning", "namespace": RELEASE_NAMESPACE},
                    f"The kube-rendezvous operator in {RELEASE_NAMESPACE} exports no metrics",
                )
            ]
        },
    ),
    Scenario(
        "operator-no-leader",
        {f'kube_rendezvous_operator_leader{{namespace="{RELEASE_NAMESPACE}",{TARGET}}}': "1x20 0x19"},
        {
            "KubeRendezvousOperatorNoLeader": [
                Alert(
                    {"severity": "warning"},
                    f"No kube-rendezvous operator replica in {RELEASE_NAMESPACE} acts (all stand by)",
                )
            ]
        },
    ),
]

TEMPLATE = re.compile(r"\{\{\s*(\$labels\.(\w+)|\$value \| humanize)\s*\}\}")


def expand(text: str, alert: Alert) -> str:
    """``text`` with the alert templates the chart uses expanded (``$labels.x``, ``$value | humanize``)."""
    expanded = TEMPLATE.sub(lambda m: alert.labels[m.group(2)] if m.group(2) else alert.value, text)
    assert "{{" not in expanded, f"a template this test does not expand: {text!r}"
    return expanded


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure_binaries().promtool


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The chart's PrometheusRule's ``spec`` (rendered with the default values, in ``RELEASE_NAMESPACE``)."""
    helm = Helm(ensure_binaries().helm, tmp_path_factory.mktemp("helm-home"))
    spec: dict[str, Any] = the(helm.template("metrics.prometheusRule.enabled=true"), "PrometheusRule")["spec"]
    return spec


@pytest.fixture(scope="module")
def rules_file(rules: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("alerts") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rules["groups"]}, sort_keys=False))
    return path


def alert_rules(rules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule}


def promtool_run(promtool: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *map(str, args)], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT, check=False
    )


def unit_test(scenario: Scenario, rules_file: Path, alerts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The promtool test file of ``scenario``: its series, and at ``EVAL_TIME`` every alert of the file."""
    return {
        "rule_files": [str(rules_file)],
        "evaluation_interval": INTERVAL,
        "tests": [
            {
                "interval": INTERVAL,
                "input_series": [
                    {"series": selector, "values": values} for selector, values in scenario.series().items()
                ],
                "alert_rule_test": [
                    {
                        "eval_time": EVAL_TIME,
                        "alertname": name,
                        "exp_alerts": [
                            {
                                "exp_labels": expected.labels,
                                "exp_annotations": {
                                    key: expand(text, expected) for key, text in rule["annotations"].items()
                                },
                            }
                            for expected in scenario.firing.get(name, [])
                        ],
                    }
                    for name, rule in alerts.items()
                ],
            }
        ],
    }


def test_promtool_is_debian_bookworms_prometheus_2_42(promtool: Path) -> None:
    shown = promtool_run(promtool, "--version")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "version 2.42." in shown.stdout + shown.stderr


def test_promtool_check_rules_accepts_the_chart_rules(promtool: Path, rules_file: Path) -> None:
    checked = promtool_run(promtool, "check", "rules", rules_file)
    assert checked.returncode == 0, f"promtool check rules:\n{checked.stdout}\n{checked.stderr}"


def test_every_alert_fires_in_a_scenario_and_each_scenario_says_its_summary(rules: dict[str, Any]) -> None:
    alerts = alert_rules(rules)
    fired = {name for scenario in SCENARIOS for name in scenario.firing}
    assert fired == set(alerts), "an alert with no firing scenario, or a scenario naming no alert of the chart"
    for scenario in SCENARIOS:
        for name, expected in scenario.firing.items():
            for alert in expected:
                assert expand(alerts[name]["annotations"]["summary"], alert) == alert.summary, (scenario.name, name)
    assert any(not scenario.firing for scenario in SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[scenario.name for scenario in SCENARIOS])
def test_promtool_test_rules(
    scenario: Scenario, promtool: Path, rules: dict[str, Any], rules_file: Path, tmp_path: Path
) -> None:
    test_file = tmp_path / f"{scenario.name}.test.yaml"
    test_file.write_text(yaml.safe_dump(unit_test(scenario, rules_file, alert_rules(rules)), sort_keys=False))
    tested = promtool_run(promtool, "test", "rules", test_file)
    assert tested.returncode == 0, f"promtool test rules {scenario.name}:\n{tested.stdout}\n{tested.stderr}"
