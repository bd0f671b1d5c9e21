"""Override validation shared by the CLI and the trigger form: one line naming the key."""
import pytest

from core.config import check_override


@pytest.mark.parametrize("item,message", [
    ("train.foo=1", "unknown key train.foo"),
    ("train.lr=abc", "train.lr: expected a number, got 'abc'"),
    ("train.epochs=1.5", "train.epochs: expected an integer, got 1.5"),
    ("train.lr.x=1", "unknown key train.lr.x"),
    ("nope=1", "unknown key nope"),
])
def test_bad_override_message_names_the_key(item, message):
    assert check_override(item) == message


@pytest.mark.parametrize("item", ["train.lr=0.002", "runner.env.X=1", " select.hours = 2",
                                  "decode.acwt=0.5,0.6", "train.teacher_recipe.epochs=3"])
def test_good_overrides_pass(item):
    assert check_override(item) is None


def test_not_a_pair_and_empty_key():
    assert "key=value" in check_override("not-a-pair")
    assert "empty key" in check_override("=1")


def test_airflow_param_refusal_carries_the_message():
    from airflow.sdk import Param
    from airflow.sdk.definitions.param import ParamValidationError

    from amflow.form_checks import OVERRIDE_FORMAT, register

    register()
    p = Param(None, type=["null", "array"], items={"type": "string", "format": OVERRIDE_FORMAT})
    assert p.resolve(["train.lr=0.1"]) == ["train.lr=0.1"]
    with pytest.raises(ParamValidationError, match="unknown key train.foo"):
        p.resolve(["train.lr=0.1", "train.foo=1"])
    with pytest.raises(ParamValidationError, match=r"train.lr: expected a number, got 'abc'"):
        p.resolve(["train.lr=abc"])
