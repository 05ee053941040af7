import pytest
from pydantic import ValidationError

from reward_server.config import RewardServerConfig, load_config
from reward_server.errors import ConfigError


def test_defaults_match_the_papers() -> None:
    c = RewardServerConfig()
    assert (c.rubric.reward_lambda, c.rubric.margin_k, c.rubric.threshold) == (10.0, 20.0, 0.5)
    assert (c.rubric.min_rules, c.rubric.max_rules) == (2, 10)
    assert (c.rubric.invalid_floor, c.rubric.format_floor) == (0.0, 0.1)
    assert c.nli.threshold == 0.5
    assert c.server.auth_token is None


def test_yaml_env_and_overrides_layer_in_order(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("server:\n  port: 1234\n  max_batch_items: 10\nrubric:\n  margin_k: 5\n")
    env = {"REWARD_SERVER__SERVER__PORT": "2345", "REWARD_SERVER__RUBRIC__CARDINALITY": "linear"}
    c = load_config(f, overrides=["server.port=3456"], env=env)
    assert c.server.port == 3456  # override beats env beats file
    assert c.server.max_batch_items == 10
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
        (["judge.kind=gpt"], "judge.kind"),
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


def test_every_field_is_documented() -> None:
    def walk(model: type) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                missing += [f"{name}.{m}" for m in walk(ann)]
            elif not field.description:
                missing.append(name)
        return missing

    assert walk(RewardServerConfig) == []
