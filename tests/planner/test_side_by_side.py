"""Several models side by side (``vllm-fleet plan --model A --model B --model C --asleep``): Seed 001's
layout on a faked four-GPU NVML view, planned, then checked by ``vllm-fleet check`` and
``vllm-fleet infernet-config`` through the real CLI, as an operator would run them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_planner.placement import ModelSpec, make_node_plan
from fleet_planner.plan import PlanRequest
from fleetspec.fleetfile import load_fleet, parse_fleet
from fleetspec.gpus import Gpu
from tests.supervisor.test_validation import FOUR_GPUS
from vllm_fleet.cli import main

Capture = pytest.CaptureFixture[str]
FOUR_L4 = [Gpu(i, "NVIDIA L4", f"GPU-L4-{i}", 23034, 0) for i in range(4)]
# Random-weight Llamas as `vllm-fleet make-tiny-model DIR --hidden 3072 --heads 24 --kv-heads 8
# --intermediate 8192 --layers N` writes them: 5.6 B ("14B-style"), 2.8 B ("8B-style"), 1.4 B.
SEED = (("q14", 56, "qwen2.5:14b"), ("l8", 28, "llama3.1:8b"), ("m7", 14, "mistral:7b"))


def llama(layers: int, hidden: int = 3072, heads: int = 24) -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": 8192, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": 8, "head_dim": hidden // heads, "vocab_size": 515,
            "max_position_embeddings": 2048, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def model_dir(tmp_path: Path, name: str, config: dict[str, Any]) -> str:
    d = tmp_path / "models" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def seed_argv(tmp_path: Path) -> list[str]:
    """Seed 001's layout: the 14B-style and 8B-style models awake, a third asleep beside the second."""
    argv = ["--context", "2048"]
    for name, layers, served in SEED:
        argv += ["--model", model_dir(tmp_path, name, llama(layers)), "--served-name", served]
    return [*argv, "--asleep"]


def run(argv: list[str], capsys: Capture) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Gpu]:
    """Four H200s as NVML reports them, for the planner and the supervisor; the planned file's
    ports (8080, 8001.., 9400) count as free: this test host is shared, the plan is what is tested."""
    found = list(FOUR_GPUS)
    monkeypatch.setattr("fleet_planner.command.discover_gpus", lambda: found)
    monkeypatch.setattr("fleet_supervisor.commands.discover_gpus", lambda: found)
    monkeypatch.setattr("fleet_supervisor.hostcheck.port_in_use", lambda host, port: None)
    monkeypatch.chdir(tmp_path)  # check looks for leftovers of an earlier `up` in ./.fleet
    return found


def plan_seed(tmp_path: Path, capsys: Capture, *extra: str) -> tuple[str, str]:
    code, out, err = run(["plan", *seed_argv(tmp_path), "--fleet-file", "fleet.yaml", *extra], capsys)
    assert code == 0, err
    return out, str(tmp_path / "fleet.yaml")


def test_seed_layout_is_two_tp2_groups_and_a_sleeper_on_the_second(tmp_path: Path, host: list[Gpu],
                                                                   capsys: Capture) -> None:
    out, path = plan_seed(tmp_path, capsys)
    fleet = load_fleet(path)
    assert [(i.name, i.gpus, i.tp, i.pipeline_parallel_size) for i in fleet.instances] == [
        ("qwen2.5-14b", [0, 1], 2, 1), ("llama3.1-8b", [2, 3], 2, 1), ("mistral-7b", [2, 3], 2, 1)]
    assert [i.names for i in fleet.instances] == [["qwen2.5:14b"], ["llama3.1:8b"], ["mistral:7b"]]
    sleep = [i.sleep for i in fleet.instances]
    assert sleep[0] is None and sleep[1] is not None and sleep[1].preload and sleep[2] is not None
    assert not sleep[2].preload and fleet.swap.budget == 1.0
    assert {i.gpu_memory_utilization for i in fleet.instances} == {0.9}
    assert fleet.instances[0].vllm_args == ["--max-model-len", "2048", "--dtype", "bfloat16"]
    # The plan says what it did and why.
    assert "4 × 140.4 GiB (NVIDIA H200) [NVML]" in out
    assert "GPUs       0,1  CUDA_VISIBLE_DEVICES=0,1  TP=2 × PP=1" in out
    assert "GPUs       2,3  CUDA_VISIBLE_DEVICES=2,3  TP=2 × PP=1" in out
    assert ("GPUs 2,3: llama3.1-8b 0.9 + mistral-7b 0.9 = 1.8 > swap.budget 1.0: one awake at a time; a request "
            "for an asleep model puts the awake one to sleep first (swap)") in out
    assert "qwen2.5-14b fits 1 GPU; it gets 2 (TP=2)" in out
    assert "fit: yes; node VRAM tier >=48gb" in out
    assert "# Budget on GPUs 2,3:" in Path(path).read_text()


def test_the_planned_file_passes_check_with_its_groups_and_sleep_lines(tmp_path: Path, host: list[Gpu],
                                                                      capsys: Capture) -> None:
    _, path = plan_seed(tmp_path, capsys)
    code, out, err = run(["check", "-c", path], capsys)
    assert code == 0, err
    blocks = {b.split("\n", 1)[0]: b for b in out.split("\ninstance ")[1:]}
    assert set(blocks) == {"qwen2.5-14b", "llama3.1-8b", "mistral-7b"}
    assert "GPUs: 0 (NVIDIA H200), 1 (NVIDIA H200)   tp=2 pp=1" in blocks["qwen2.5-14b"]
    assert "CUDA_VISIBLE_DEVICES=0,1 VLLM_HTTP_TIMEOUT_KEEP_ALIVE=3600\n" in blocks["qwen2.5-14b"]
    assert "sleep:" not in blocks["qwen2.5-14b"]
    for name in ("llama3.1-8b", "mistral-7b"):
        assert "GPUs: 2 (NVIDIA H200), 3 (NVIDIA H200)   tp=2 pp=1" in blocks[name]
        assert "CUDA_VISIBLE_DEVICES=2,3 VLLM_HTTP_TIMEOUT_KEEP_ALIVE=3600\n" in blocks[name]
        assert "--tensor-parallel-size 2 --pipeline-parallel-size 1" in blocks[name]
        assert "--enable-sleep-mode" in blocks[name] and "VLLM_SERVER_DEV_MODE=1" in blocks[name]
        assert "vram tier: >=48gb" in blocks[name]
    assert ("sleep:   vLLM sleep mode, level 1 (auto: host RAM holds its 0.0 GiB of weights while it sleeps); "
            "share 0.9 of 2, 3; sleeps only when another model needs the memory; preloaded") in blocks["llama3.1-8b"]
    assert "share 0.9 of 2, 3; sleeps only when another model needs the memory; asleep after start-up" in \
        blocks["mistral-7b"]


def test_infernet_config_reports_instance_and_node_tiers(tmp_path: Path, host: list[Gpu], capsys: Capture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _, path = plan_seed(tmp_path, capsys)
    code, out, err = run(["infernet-config", "-c", path], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["served_models"] == ["qwen2.5:14b", "llama3.1:8b", "mistral:7b"]
    assert [(i["name"], i["host"], i["vram_tier"]) for i in data["vllm_instances"]] == [
        ("qwen2.5-14b", "http://127.0.0.1:8001", ">=48gb"), ("llama3.1-8b", "http://127.0.0.1:8002", ">=48gb"),
        ("mistral-7b", "http://127.0.0.1:8003", ">=48gb")]
    assert data["vram_tier"] == ">=48gb"
    # On four 24 GB GPUs the same layout fits, and a pair of them is a 24-48gb group (46,068 MiB).
    monkeypatch.setattr("fleet_planner.command.discover_gpus", lambda: list(FOUR_L4))
    monkeypatch.setattr("fleet_supervisor.commands.discover_gpus", lambda: list(FOUR_L4))
    out, path = plan_seed(tmp_path, capsys)
    assert "fit: yes; node VRAM tier 24-48gb" in out
    code, out, _ = run(["infernet-config", "-c", path], capsys)
    data = json.loads(out)
    assert code == 0 and data["vram_tier"] == "24-48gb"
    assert {i["vram_tier"] for i in data["vllm_instances"]} == {"24-48gb"}


def test_plan_json_shows_groups_devices_and_the_budget(tmp_path: Path, host: list[Gpu], capsys: Capture) -> None:
    code, out, _ = run(["plan", *seed_argv(tmp_path), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["fits"] is True and doc["problems"] == [] and doc["vram_tier"] == ">=48gb"
    assert [(i["name"], i["cuda_visible_devices"], i["fit"]["tensor_parallel_size"], i["asleep"])
            for i in doc["instances"]] == [("qwen2.5-14b", "0,1", 2, False), ("llama3.1-8b", "2,3", 2, False),
                                           ("mistral-7b", "2,3", 2, True)]
    assert doc["instances"][2]["shares_gpus_with"] == ["llama3.1-8b"]
    assert doc["budgets"] == [{"gpus": [2, 3], "instances": ["llama3.1-8b", "mistral-7b"],
                               "gpu_memory_utilization": 0.9, "swap_budget": 1.0, "awake_at_once": 1,
                               "lowered_from": None, "sleep_residue_mib_per_gpu": 1024}]
    parse_fleet(yaml.safe_load(doc["fleet_file"]))


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda d: d["instances"][2].pop("sleep"),
     "instances[2] (mistral-7b).gpus: GPU 2 is already used by instance 'llama3.1-8b'"),
    (lambda d: d["instances"][2].update(sleep={"preload": True}),
     "instances[2] (mistral-7b).sleep.preload: GPU 2 cannot hold the preloaded instances llama3.1-8b (0.9), "
     "mistral-7b (0.9) = 1.8 within swap.budget (1)"),
    (lambda d: d["instances"][1].update(tensor_parallel_size=4), "instances[1] (llama3.1-8b).tensor_parallel_size"),
    (lambda d: d["instances"][0].update(gpus=[0, 1, 2]), "instances[1] (llama3.1-8b).gpus: GPU 2 is already used"),
    (lambda d: d["swap"].update(budget=0.5), "instances[1] (llama3.1-8b).sleep.share: its share 0.9 is more than "
     "swap.budget (0.5)"),
    (lambda d: d["instances"][1].update(gpus=[2, 4]), "instances[1] (llama3.1-8b).gpus: GPU 4 does not exist"),
])
def test_a_broken_planned_file_exits_2_naming_the_key(tmp_path: Path, host: list[Gpu], capsys: Capture,
                                                      edit: Any, needle: str) -> None:
    _, path = plan_seed(tmp_path, capsys)
    doc = yaml.safe_load(Path(path).read_text())
    edit(doc)
    Path(path).write_text(yaml.safe_dump(doc))
    code, _, err = run(["check", "-c", path], capsys)
    assert code == 2, err
    assert needle in err


def test_three_gpus_on_this_host_exit_2_naming_the_gpu(tmp_path: Path, host: list[Gpu], capsys: Capture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _, path = plan_seed(tmp_path, capsys)
    monkeypatch.setattr("fleet_supervisor.commands.discover_gpus", lambda: list(FOUR_GPUS[:3]))
    code, _, err = run(["check", "-c", path], capsys)
    assert code == 2
    assert "instances[1] (llama3.1-8b).gpus: GPU 3 does not exist on this host (GPUs here: 0, 1, 2)" in err


@pytest.mark.parametrize(("argv", "needle"), [
    (["--model", "{a}", "--asleep", "--model", "{b}"], "--asleep: the first --model"),
    (["--model", "{a}", "--asleep"], "--asleep: shares the GPU group of an awake --model given before it"),
    (["--model", "{a}", "--model", "{b}", "--replicas", "2"], "--replicas: with several --model"),
    (["--model", "{a}", "--model", "{b}", "--nodes", "2"], "--nodes: several --model are planned on one host"),
    (["--model", "{a}", "--served-name", "x", "--model", "{b}", "--served-name", "x"],
     "--served-name: two --model are served as 'x'"),
    (["--model", "{a}", "--model", "{b}", "--context", "0"], "--context: must be positive"),
    (["--model", "{a}", "--model", "org/unknown"], "--model: 'org/unknown' is not a local directory"),
    (["--model", "{a}", "--model", "{b}", "--gpus", "four"], "--gpus: cannot read 'four'"),
])
def test_bad_input_exits_2_naming_the_flag(tmp_path: Path, host: list[Gpu], capsys: Capture, argv: list[str],
                                           needle: str) -> None:
    a, b = model_dir(tmp_path, "a", llama(28)), model_dir(tmp_path, "b", llama(14))
    code, _, err = run(["plan", *[x.format(a=a, b=b) for x in argv]], capsys)
    assert code == 2, err
    assert needle in err


def test_asleep_before_any_model_is_a_usage_error(capsys: Capture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan", "--asleep", "--model", "m"])
    assert e.value.code == 2
    assert "--asleep: give it after the --model it describes" in capsys.readouterr().err


def test_models_that_do_not_fit_say_so_and_write_nothing(tmp_path: Path, host: list[Gpu], capsys: Capture) -> None:
    code, out, err = run(["plan", *seed_argv(tmp_path), "--gpus", "2x8GB", "--fleet-file", "fleet.yaml"], capsys)
    assert code == 1
    assert "fit: THE MODELS DO NOT FIT these GPUs" in out
    assert "qwen2.5-14b: does not fit even all 2 GPUs at gpu_memory_utilization 0.9" in out
    assert "no fleet file written to fleet.yaml: the models do not fit these GPUs: qwen2.5-14b" in err
    assert not (tmp_path / "fleet.yaml").exists()
    argv = [*seed_argv(tmp_path)[:-1], "--model", model_dir(tmp_path, "d", llama(14)), "--served-name", "d"]
    code, out, err = run(["plan", *argv, "--gpus", "2x80GB"], capsys)
    assert code == 1
    assert "4 awake models need a GPU group each, and this node has 2 GPUs; mark some --asleep" in err


def spec(tmp_path: Path, name: str, layers: int, asleep: bool = False, **kw: Any) -> ModelSpec:
    return ModelSpec(PlanRequest(model=model_dir(tmp_path, name, llama(layers)), context=2048, **kw), asleep)


def test_the_node_is_split_evenly_as_tensor_parallelism(tmp_path: Path) -> None:
    two = make_node_plan([spec(tmp_path, "a", 28, gpus="8x80GB"), spec(tmp_path, "b", 14, gpus="8x80GB")],
                         lambda: [])
    assert [p.gpus for p in two.placements] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    three = make_node_plan([spec(tmp_path, n, 14, gpus="4x80GB") for n in "abc"], lambda: [])
    assert [p.gpus for p in three.placements] == [(0, 1), (2,), (3,)]
    # A model that needs two 24 GB GPUs keeps them; the small one grows to the same size.
    big = make_node_plan([spec(tmp_path, "big", 112, gpus="4x24GB"), spec(tmp_path, "small", 14, gpus="4x24GB")],
                         lambda: [])
    assert [len(p.gpus) for p in big.placements] == [2, 2]
    assert any(n.startswith("small fits 1 GPU; it gets 2") for n in big.notes)


def test_growth_stays_tensor_parallel(tmp_path: Path) -> None:
    """8 KV heads: TP=5 and TP=6 neither divide them nor are multiples of them (vLLM would refuse),
    so one group on six GPUs stops at TP=4 and two GPUs stay idle, rather than run PP."""
    plan = make_node_plan([spec(tmp_path, "a", 28, gpus="6x80GB"),
                           spec(tmp_path, "b", 14, asleep=True, gpus="6x80GB")], lambda: [])
    assert [len(p.gpus) for p in plan.placements] == [4, 4]
    assert "2 GPUs left idle: no group could take them as tensor parallelism" in plan.notes
    odd = make_node_plan([spec(tmp_path, n, 14, gpus="6x80GB") for n in "abc"], lambda: [])
    assert [len(p.gpus) for p in odd.placements] == [2, 2, 2]
    assert all(p.plan.fit is not None and p.plan.fit.layout.pp == 1 for p in odd.placements)


def test_sleepers_residue_lowers_the_utilization_on_small_gpus(tmp_path: Path) -> None:
    plan = make_node_plan([spec(tmp_path, "a", 2, gpus="1x8GB", seqs=1),
                           spec(tmp_path, "b", 2, asleep=True, gpus="1x8GB", seqs=1)], lambda: [])
    assert plan.fits, plan.problems
    assert plan.budgets[0].utilization == 0.87 and plan.budgets[0].lowered_from == 0.9
    assert any("lowered from 0.9 to 0.87" in n for n in plan.notes)


def test_low_shares_let_both_be_awake(tmp_path: Path, capsys: Capture) -> None:
    code, out, _ = run(["plan", *seed_argv(tmp_path), "--gpus", "4x141GB", "--gpu-memory-utilization", "0.45"],
                       capsys)
    assert code == 0
    assert "GPUs 2,3: llama3.1-8b 0.45 + mistral-7b 0.45 = 0.9 <= swap.budget 1.0: all can be awake at once" in out


def test_model_flags_belong_to_the_model_before_them(tmp_path: Path, capsys: Capture) -> None:
    a, b = model_dir(tmp_path, "a", llama(28)), model_dir(tmp_path, "b", llama(14))
    code, out, _ = run(["plan", "--seqs", "4", "--model", a, "--context", "1024", "--model", b, "--gpus", "2x80GB",
                        "--json"], capsys)
    assert code == 0
    loads = [i["load"] for i in json.loads(out)["instances"]]
    assert loads == [{"context": 1024, "seqs": 4}, {"context": 8192, "seqs": 4}]
    # The same flag after the last of several models reads as meant for all: the plan says it is not.
    code, out, _ = run(["plan", "--model", a, "--model", b, "--context", "2048", "--gpus", "2x80GB"], capsys)
    assert code == 0 and f"--context 2048 applies to {b} only (the --model before it)" in out


def test_one_model_plans_as_before_whatever_the_flag_order(tmp_path: Path, capsys: Capture) -> None:
    a = model_dir(tmp_path, "a", llama(28))
    outs = [run(["plan", *argv, "--gpus", "4x80GB", "--json"], capsys)[1] for argv in (
        ["--model", a, "--context", "1024", "--served-name", "x"], ["--context", "1024", "--served-name", "x",
                                                                    "--model", a])]
    assert outs[0] == outs[1]
    doc = json.loads(outs[0])
    assert doc["replicas"] == 4 and doc["load"]["context"] == 1024 and doc["model"]["served_name"] == "x"


def test_up_with_several_models(tmp_path: Path, host: list[Gpu], capsys: Capture,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []
    monkeypatch.setattr("fleet_supervisor.commands.cmd_up", lambda path: started.append(path) or 0)
    code, out, _ = run(["up", *seed_argv(tmp_path), "--dry-run"], capsys)
    assert code == 0 and started == [] and "dry run: not written to .fleet/planned-fleet.yaml" in out
    code, out, _ = run(["up", *seed_argv(tmp_path)], capsys)
    assert code == 0 and started == [str(Path(".fleet") / "planned-fleet.yaml")]
    assert [i.gpus for i in load_fleet(tmp_path / started[0]).instances] == [[0, 1], [2, 3], [2, 3]]
