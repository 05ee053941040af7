import pytest
from pydantic import ValidationError

from reward_server.config import RewardServerConfig, load_config
from reward_server.errors import ConfigError


def test_defaults_match_the_papers() -> None:
    c = RewardServerConfig()
    assert (c.rubric.reward_lambda, c.rubric.margin_k, c.rubric.threshold) == (10.0, 20.0, 0.5)
    assert (c.rubric.min_rules, c.rubric.max_rules) == (2, 10)
    assert (c.service.policy_invalid_penalty, c.rubric.format_floor) == (0.0, 0.1)
    assert c.nli.threshold == 0.5
    assert c.server.auth_token is None


def test_yaml_env_and_overrides_layer_in_order(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("server:\n  port: 1234\nservice:\n  limits:\n    max_batch_items: 10\n"
                 "rubric:\n  margin_k: 5\n")
    env = {"REWARD_SERVER__SERVER__PORT": "2345", "REWARD_SERVER__RUBRIC__CARDINALITY": "linear"}
    c = load_config(f, overrides=["server.port=3456"], env=env)
    assert c.server.port == 3456  # override beats env beats file
    assert c.service.limits.max_batch_items == 10
    assert c.rubric.margin_k == 5.0
    assert c.rubric.cardinality == "linear"


def test_token_from_environment() -> None:
    c = load_config(env={"REWARD_SERVER_TOKEN": "s3cret"})
    assert c.server.auth_token is not None
    assert c.server.auth_token.get_secret_value() == "s3cret"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["server.port=-1"], "server.port"),
        (["server.bogus=1"], "server.bogus"),
        (["engines.judge.kind=gpt"], "engines.judge"),
        (["nli.model=x"], "nli.model"),
        (["rubric.template_version=parl-v9"], "rubric.template_version"),
        (["rubric.threshold=1.5"], "rubric.threshold"),
        (["nli.long_premise=chop"], "nli.long_premise"),
        (["server.port"], "expected section.field=value"),
    ],
)
def test_invalid_values_name_the_field(overrides, needle) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(overrides=overrides, env={})
    assert needle in str(e.value)


def test_config_is_frozen() -> None:
    c = RewardServerConfig()
    with pytest.raises(ValidationError):
        c.server.port = 1  # type: ignore[misc]


def test_missing_and_malformed_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(bad, env={})


def _models(ann: object) -> list[type]:
    """The pydantic models inside an annotation (unions, Annotated, Optional included)."""
    import typing

    if isinstance(ann, type) and hasattr(ann, "model_fields"):
        return [ann]
    return [m for arg in typing.get_args(ann) for m in _models(arg)]


def test_every_field_is_documented() -> None:
    def walk(model: type, seen: set[type]) -> list[str]:
        missing = []
        seen.add(model)
        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            subs = _models(field.annotation)
            if not subs and not field.description and name != "kind":
                missing.append(f"{model.__name__}.{name}")
            for sub in subs:
                if sub not in seen:
                    missing += [f"{name}.{m}" for m in walk(sub, seen)]
        return missing

    assert walk(RewardServerConfig, set()) == []


def test_engines_are_a_union_on_kind_that_rejects_misplaced_fields() -> None:
    c = load_config(overrides=["engines.judge={kind: openai, base_url: 'http://h:8000/v1', model: m}",
                               "engines.nli.kind=judge"], env={})
    assert c.engines.judge is not None and c.engines.judge.kind == "openai"
    assert c.engines.nli is not None and c.engines.nli.kind == "judge"
    with pytest.raises(ConfigError, match=r"kind=judge has no batching block.*engines\.judge\.batching"):
        load_config(overrides=["engines.judge.kind=fake", "engines.nli={kind: judge, batching: {max_items: 8}}"],
                    env={})
    with pytest.raises(ConfigError, match="base_url"):  # an openai field on a transformers judge
        load_config(overrides=["engines.judge={kind: transformers, model: m, base_url: x}"], env={})
    with pytest.raises(ConfigError, match=r"engines\.judge must be set"):
        load_config(overrides=["engines.nli.kind=judge"], env={})


def test_ray_knobs_are_refused_in_process_mode() -> None:
    with pytest.raises(ConfigError, match=r"serving\.ray\.deploy is set but serving\.mode is inprocess"):
        load_config(overrides=["serving.ray.deploy=false"], env={})
    c = load_config(overrides=["serving.mode=ray", "serving.ray.deploy=false"], env={})
    assert c.serving.ray.deploy is False


def test_deployment_settings_the_layout_would_ignore_are_refused() -> None:
    ray = ["serving.mode=ray"]
    with pytest.raises(ConfigError, match=r"serving\.ray\.judge is set but serving\.ray\.layout is "
                       r"service.*serving\.ray\.service"):
        load_config(overrides=[*ray, "serving.ray.layout=service", "serving.ray.judge.num_gpus=1"],
                    env={})
    with pytest.raises(ConfigError, match=r"serving\.ray\.service is set but serving\.ray\.layout "
                       r"is engines"):
        load_config(overrides=[*ray, "serving.ray.service.num_gpus=1"], env={})
    c = load_config(overrides=[*ray, "serving.ray.layout=service", "serving.ray.service.num_gpus=1"],
                    env={})
    assert c.serving.ray.service.num_gpus == 1 and c.serving.ray.app_name("service") == "reward-service"


def test_no_engine_by_default() -> None:
    c = load_config(env={})
    assert c.engines.judge is None and c.engines.nli is None and not c.engines.fake


def test_errors_name_the_source_show_the_value_and_suggest_the_key(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("server:\n  port: 1\n  prot: 3\nnli:\n  model: x\nengines:\n  judge:\n"
                 "    kind: transformers\n    model: m\n    forward_batch: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, env={"REWARD_SERVER__SERVER__MAX_MESSAGE_BYTES": "lots"})
    text = str(e.value)
    assert f"server.prot (from {f}:3): unknown key; did you mean server.port?" in text
    assert f"nli.model (from {f}:5): unknown key; did you mean engines.nli.model?" in text
    assert "engines.judge.forward_batch" in text and "did you mean engines.judge.forward_batch_size?" in text
    assert ("server.max_message_bytes (from environment REWARD_SERVER__SERVER__MAX_MESSAGE_BYTES): "
            "input should be a valid integer") in text and "(got 'lots')" in text


def test_a_field_of_another_kind_says_which_kind_owns_it() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(overrides=["engines.judge={kind: transformers, model: m, base_url: x}"], env={})
    assert "not a field of kind 'transformers' (it belongs to kind openai)" in str(e.value)
    assert "--set engines.judge={kind: transformers" in str(e.value)


def test_a_later_layer_owns_the_keys_it_replaced(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("server:\n  port: 7\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, overrides=["server.port=-1"], env={})
    assert "server.port (from --set server.port=-1)" in str(e.value) and "(got -1)" in str(e.value)
    with pytest.raises(ConfigError, match="field required") as e:
        load_config(overrides=["engines.judge.kind=transformers"], env={})
    assert "engines.judge.model (from --set engines.judge.kind=transformers)" in str(e.value)
