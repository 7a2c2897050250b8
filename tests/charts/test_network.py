"""The chart's network scheduling values: `services.policy.network` and `services.policy.networkClasses`
(`rubick service policy --network MODE --network-classes K`), and `agent.trafficClasses` (the agents'
`--traffic-classes TABLE` or `--no-traffic-classes`). Rendered with Helm's own code (tests/charts/chart.py)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from agents.traffic import DEFAULT, TrafficClassError, parse
from controlplane.cli import build_parser

from . import chart as C
from .chart import EXTERNAL, merge, one, render

NETWORK = merge(EXTERNAL, {"services": {"policy": {"network": "echelonflow", "networkClasses": 6}},
                           "agent": {"trafficClasses": "0:sl=3,tc=136;1:sl=2,tc=104"}})
OFF = merge(EXTERNAL, {"agent": {"trafficClasses": "off"}})


@pytest.fixture(scope="module")
def rendered():
    with C.load() as chart:
        return {name: render(values, chart=chart) for name, values in
                (("defaults", EXTERNAL), ("network", NETWORK), ("off", OFF))}


def args_of(objects, kind: str, name: str) -> list[str]:
    return one(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]["args"]


def policy_args(objects) -> list[str]:
    return args_of(objects, "Deployment", "rubick-policy")


def agent_args(objects) -> list[str]:
    return args_of(objects, "DaemonSet", "rubick-agent")


def test_the_values_default_to_no_network_and_the_agents_own_table():
    with C.load() as chart:
        values = chart.values
    assert values["services"]["policy"]["network"] == "none"
    assert values["services"]["policy"]["networkClasses"] == 4
    assert values["agent"]["trafficClasses"] == ""


def test_no_network_args_by_default(rendered):
    objects = rendered["defaults"]
    assert not {"--network", "--network-classes"} & set(policy_args(objects))
    assert not {"--traffic-classes", "--no-traffic-classes"} & set(agent_args(objects))
    for name in ("recorder", "admission", "modeler", "clock"):
        assert "--network" not in args_of(objects, "Deployment", f"rubick-{name}")
    # the number of classes alone turns nothing on
    quiet = render(merge(EXTERNAL, {"services": {"policy": {"networkClasses": 6}}}))
    assert "--network" not in policy_args(quiet) and "--network-classes" not in policy_args(quiet)


def test_the_policy_service_runs_the_network_scheduler_when_set(rendered):
    objects = rendered["network"]
    args = policy_args(objects)
    assert args[args.index("--network"):args.index("--network") + 4] == ["--network", "echelonflow",
                                                                       "--network-classes", "6"]
    ns = build_parser().parse_args(args)
    assert (ns.command, ns.name, ns.network, ns.network_classes) == ("service", "policy", "echelonflow", 6)
    for name in ("recorder", "admission", "modeler", "clock"):
        assert "--network" not in args_of(objects, "Deployment", f"rubick-{name}"), name
    assert C.validate(objects) == []
    for mode in ("fair", "coflow"):
        args = policy_args(render(merge(EXTERNAL, {"services": {"policy": {"network": mode}}})))
        assert args[args.index("--network") + 1] == mode and args[args.index("--network-classes") + 1] == "4"


def test_the_agents_traffic_class_table(rendered):
    args = agent_args(rendered["network"])
    table = args[args.index("--traffic-classes") + 1]
    assert table == "0:sl=3,tc=136;1:sl=2,tc=104" and "--no-traffic-classes" not in args
    assert parse(table).text() == table
    args = agent_args(rendered["off"])
    assert "--no-traffic-classes" in args and "--traffic-classes" not in args
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["agent"]
    known = {o for a in sub._actions for o in a.option_strings}
    if not {"--launcher", "--k8s-namespace", "--reporter-secret"} <= known:
        pytest.skip("rubick agent lacks the Kubernetes flags here")
    from agents.cli import traffic_classes

    for name, expected in (("network", parse(table)), ("off", None), ("defaults", DEFAULT)):
        ns = parser.parse_args([a.replace("$(NODE_NAME)", "gpu-0") for a in agent_args(rendered[name])])
        assert traffic_classes(ns) == expected, name
    assert C.validate(rendered["off"]) == []


@pytest.mark.parametrize("values, message", [
    ({"services": {"policy": {"network": "ring"}}}, r"/services/policy/network.*value must be one of"),
    ({"services": {"policy": {"network": True}}}, r"/services/policy/network"),
    ({"services": {"policy": {"networkClasses": 0}}}, r"/services/policy/networkClasses.*minimum"),
    ({"services": {"policy": {"networkClasses": 9}}}, r"/services/policy/networkClasses.*maximum"),
    ({"services": {"policy": {"networkClasses": "4"}}}, r"/services/policy/networkClasses.*want integer"),
    ({"services": {"policy": {"networkClasses": 2.5}}}, r"/services/policy/networkClasses"),
    ({"agent": {"trafficClasses": "0:sl=99"}}, r"/agent/trafficClasses.*does not match pattern"),
    ({"agent": {"trafficClasses": "on"}}, r"/agent/trafficClasses.*does not match pattern"),
    ({"agent": {"trafficClasses": 3}}, r"/agent/trafficClasses.*want string"),
    ({"agent": {"trafficClass": "off"}}, r"additional properties 'trafficClass' not allowed"),
])
def test_the_schema_refuses(values, message):
    with pytest.raises(Exception, match=message) as error:
        render(merge(EXTERNAL, values))
    assert "schema" in str(error.value)


GOOD_TABLES = ["0:sl=3,tc=136;1:sl=2,tc=104", "0:sl=5", "7:tc=255", "0:tc=184,sl=5", "0:sl=15,tc=0;",
               "0:sl=5,tc=184; 1:sl=4,tc=136", DEFAULT.text()]
BAD_TABLES = ["0:sl=16", "0:tc=256", "8:sl=1", "0:", "0:sl=1,sl=2", "0:xl=1", "0 sl=1", "0:sl=-1", "0:sl=1;;1:sl=2",
              ";", "0:sl=1,tc=2,sl=3", "a:sl=1", "0:sl=1.5"]


def test_the_table_pattern_agrees_with_the_agents_parser():
    schema = json.loads((C.CHART / "values.schema.json").read_text())["properties"]["agent"]["properties"]["trafficClasses"]
    for value in ["", "off", *GOOD_TABLES]:
        jsonschema.validate(value, schema)
        if value not in ("", "off"):
            parse(value)  # the agent takes it
    for value in BAD_TABLES:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value, schema)
        with pytest.raises(TrafficClassError):
            parse(value)
    assert re.fullmatch(schema["pattern"].strip("^$"), DEFAULT.text())


def test_lint_and_install_with_network_values(tmp_path):
    stub = C.with_stub(tmp_path)
    report = C.lint(NETWORK, stub)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    import yaml

    objects = [d for d in yaml.safe_load_all(C.install_dry_run(NETWORK, stub)) if d]
    assert C.validate(objects) == []
    assert "--network" in policy_args(objects) and "--traffic-classes" in agent_args(objects)
