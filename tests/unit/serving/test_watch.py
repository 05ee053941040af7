"""The Serve start-up watcher on the controller's details as Ray 2.60 reports them (the dicts
below carry the keys and message texts of ``ServeInstanceDetails`` and of
``ray.serve._private.deployment_state``): progress lines, and one line naming the deployment,
the model, the replica's exception and its log at the first failed start."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from reward_server.errors import BackendUnavailable
from reward_server.serving._private.watch import AppWatch, replica_exception, wait_apps_running

TRACEBACK = (
    "ray::ServeReplica:reward-judge:JudgeDeployment.initialize_and_get_metadata() "
    "(pid=4242, ip=127.0.0.1, actor_id=abc, repr=<ServeReplica object>)\n"
    "  File \"/x/replica.py\", line 10, in initialize_and_get_metadata\n"
    "    await self._user_callable_wrapper.initialize_callable()\n"
    "  File \"/x/transformers_judge.py\", line 80, in load\n"
    "    raise ModelLoadError(msg)\n"
    "reward_server.errors.ModelLoadError: engines.judge.model 'no-such-model' is neither a "
    "local folder nor a cached Hugging Face id\n"
)
FAILED_MSG = f"A replica failed to start with exception. Retrying 2 more time(s). Error:\n{TRACEBACK}"
WATCH = AppWatch("reward-judge", "no-such-model", "judge")


def replica(state: str, pid: int, *, rid: str = "r1") -> dict[str, Any]:
    return {"replica_id": rid, "state": state, "pid": pid, "node_ip": "127.0.0.1",
            "log_file_path": f"/serve/replica_reward-judge_JudgeDeployment_{rid}.log",
            "start_time_s": 1.0}


def app(status: str, dep: Mapping[str, Any]) -> dict[str, Any]:
    return {"reward-judge": {"status": status, "message": "",
                             "deployments": {"JudgeDeployment": dep}}}


def dep(status: str, message: str = "", *, replicas: list[dict[str, Any]] | None = None,
        dead: list[dict[str, Any]] | None = None, target: int = 1,
        required: Mapping[str, float] | None = None) -> dict[str, Any]:
    return {"status": status, "status_trigger": "CONFIG_UPDATE_STARTED", "message": message,
            "target_num_replicas": target, "replicas": replicas or [],
            "recent_dead_replicas": dead or [], "required_resources": dict(required or {"CPU": 1})}


class Sequence:
    """Serve's details over successive polls (the last one repeats)."""

    def __init__(self, *states: Mapping[str, Any]) -> None:
        self.states = list(states)

    def __call__(self) -> Mapping[str, Any]:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


def run(details: Sequence, *, fail_fast: bool = True, placement: str = "fail",
        total: Mapping[str, float] | None = None, timeout_s: float = 5.0) -> None:
    wait_apps_running([WATCH], timeout_s=timeout_s, fail_fast=fail_fast,
                      placement=placement,  # type: ignore[arg-type]
                      details=details, cluster_resources=lambda: total or {"CPU": 2.0}, poll_s=0.0)


def test_replica_exception_is_the_last_named_exception_line() -> None:
    assert replica_exception(TRACEBACK).startswith("reward_server.errors.ModelLoadError: engines.judge")
    assert replica_exception("no exception here\nlast words\n") == "last words"


def test_first_failed_start_names_deployment_model_exception_and_log(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    details = Sequence({},
                       app("DEPLOYING", dep("UPDATING", replicas=[replica("STARTING", 4242)])),
                       app("DEPLOYING", dep("UPDATING", FAILED_MSG, dead=[replica("STOPPING", 4242)])))
    with pytest.raises(BackendUnavailable) as e:
        run(details)
    msg = str(e.value)
    assert "\n" not in msg
    assert "reward-judge/JudgeDeployment" in msg and "model no-such-model" in msg
    assert "ModelLoadError: engines.judge.model 'no-such-model'" in msg
    assert "serve/replica_reward-judge_JudgeDeployment_r1.log on node 127.0.0.1" in msg
    progress = [r.getMessage() for r in caplog.records if "replicas up" in r.getMessage()]
    assert progress and "0 of 1 replicas up (1 STARTING)" in progress[0]


def test_attached_ingress_waits_through_serves_retries_until_it_gives_up(
        caplog: pytest.LogCaptureFixture) -> None:
    given_up = dep("DEPLOY_FAILED", "The deployment failed to start 3 times in a row. This may be "
                   f"due to a problem with its constructor. Error:\n{TRACEBACK}")
    details = Sequence(app("DEPLOYING", dep("UPDATING", FAILED_MSG)),
                       app("DEPLOYING", dep("UPDATING", FAILED_MSG)),
                       app("DEPLOY_FAILED", given_up))
    with pytest.raises(BackendUnavailable, match=r"could not start a replica: reward_server\.errors"):
        run(details, fail_fast=False)
    assert any("Serve retries it" in r.getMessage() for r in caplog.records)


def test_running_returns_after_progress_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    details = Sequence(app("DEPLOYING", dep("UPDATING", replicas=[replica("STARTING", 1)])),
                       app("RUNNING", dep("HEALTHY", replicas=[replica("RUNNING", 1)])))
    run(details)
    lines = [r.getMessage() for r in caplog.records]
    assert any("1 of 1 replicas up, healthy" in ln for ln in lines)
    assert any("is RUNNING" in ln for ln in lines)


def test_a_replica_no_node_can_hold_fails_at_once_on_an_embedded_ray() -> None:
    details = Sequence(app("DEPLOYING", dep("UPDATING", required={"CPU": 2, "GPU": 1})))
    with pytest.raises(BackendUnavailable, match=r"cannot be placed.*GPU: needs 1, cluster has 0"
                       r".*serving\.ray\.judge\.num_gpus"):
        run(details, total={"CPU": 4.0})


def test_on_a_cluster_a_shortfall_is_waited_for_until_the_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    details = Sequence(app("DEPLOYING", dep("UPDATING", required={"GPU": 1})))
    with pytest.raises(BackendUnavailable, match=r"not RUNNING after 0s.*0 of 1 replicas up"):
        run(details, placement="wait", timeout_s=0.0)
    assert any("waits for resources" in r.getMessage() for r in caplog.records)


def test_an_attached_ingress_without_applications_says_how_to_deploy_them() -> None:
    with pytest.raises(BackendUnavailable, match=r"not created yet; deploy them \(deploy/commands"
                       r"\.sh serve-deploy, the RayService\) or set serving\.ray\.deploy=true"):
        run(Sequence({}), fail_fast=False, placement="wait", timeout_s=0.0)
