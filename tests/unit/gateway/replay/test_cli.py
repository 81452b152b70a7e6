"""``llmgw replay`` from the command line: a scenario's configs picked by name (the
baselines among them), and a synthesized trace file carrying its keys into a replay."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gateway.cli.main import main
from gateway.cli.replay import scenario_dir

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

QUIET = ["--log-level", "error"]  # and the loggers' levels stay as they are


def test_a_scenarios_baselines_are_picked_by_name_like_any_of_its_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    argv = ["replay", "--scenario", "ratelimited", "--duration", "3", "--out", str(out)]
    code = main([*QUIET, *argv, "--config", "greedy-cost", "--config", "greedy-latency"])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert list(report["configs"]) == ["greedy-cost", "greedy-latency"]
    assert all(c["served"] == c["requests"] > 0 for c in report["configs"].values())
    assert "| greedy-cost |" in capsys.readouterr().out


def test_an_unknown_config_name_is_refused_with_the_scenarios_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", "--scenario", "ratelimited", "--config", "fastest", "--out", str(tmp_path)]
    assert main([*QUIET, *argv]) == 2
    err = capsys.readouterr().err
    assert "'fastest'" in err and "greedy-cost" in err and "routewise-a05" in err


def test_a_synthesized_trace_file_brings_its_keys_and_their_limits_to_the_replay(
    tmp_path: Path,
) -> None:
    library = scenario_dir("ratelimited")
    scenario = tmp_path / "keyed"
    (scenario / "configs").mkdir(parents=True)
    (scenario / "providers.yaml").write_text((library / "providers.yaml").read_text())
    config = (library / "configs" / "equal.yaml").read_text()
    (scenario / "configs" / "equal.yaml").write_text(config)
    (scenario / "synth.yaml").write_text(
        "model: m\nrate: 4\nduration_seconds: 10\ncallers: 3\n"
        "keys: [{name: tight, limits: {rpm: 10}}]\n"
    )
    trace, out = tmp_path / "trace.jsonl", tmp_path / "report"
    synth = ["replay", "synth", "--scenario", str(scenario), "--seed", "3", "--out", str(trace)]
    assert main([*QUIET, *synth]) == 0
    assert trace.read_text().startswith('{"kind":"key","name":"tight"')
    argv = ["replay", "--trace", str(trace), "--scenario", str(scenario), "--out", str(out)]
    assert main([*QUIET, *argv]) == 0
    summary = json.loads((out / "report.json").read_text())["configs"]["equal"]
    assert summary["served"] == 10  # the key's rpm
    assert summary["errors"] == {"429": summary["requests"] - 10}
