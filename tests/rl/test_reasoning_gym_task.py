"""``task.name=reasoning_gym``: any reasoning-gym dataset as a task — seeded, disjoint splits, the
dataset's own scorer on a robustly extracted answer, bad names refused in one line (exit 2)."""

import json

import pytest

pytest.importorskip("reasoning_gym")

from rlkit import cli  # noqa: E402
from rlkit.errors import ConfigError  # noqa: E402
from rlkit.tasks import build_task  # noqa: E402
from rlkit.tasks.reasoning_gym import extract_gym_answer  # noqa: E402


@pytest.mark.parametrize("text, prefilled, expected", [
    ("42</answer> and more", True, "42"),
    (" 42 \nrambling", True, "42"),
    ("", True, None),
    ("think... <answer>1</answer> no wait <answer> 7 </answer>", False, "7"),
    ("so <answer>19\nmore text", False, "19"),
    ("we get \\boxed{\\frac{1}{2}} done", False, "\\frac{1}{2}"),
    ("blah\nThe answer is 12.", False, "12"),
    ("\n  noreh \n", False, "noreh"),
    ("   ", False, None),
])
def test_answer_extraction(text, prefilled, expected):
    assert extract_gym_answer(text, prefilled) == expected


def test_seeded_disjoint_splits_and_the_datasets_own_scorer():
    spec = {"name": "reasoning_gym", "dataset": "spell_backward", "num_train": 30, "num_test": 10, "num_shots": 2, "seed": 3}
    task, again = build_task(spec), build_task(spec)
    train, test = task.problems("train"), task.problems("test")
    assert [p["question"] for p in train] == [p["question"] for p in again.problems("train")]  # same seed, same split
    assert len(train) == 30 and len(test) == 10
    assert not {p["question"] for p in train} & {p["question"] for p in test}
    other = build_task({**spec, "seed": 4}).problems("train")
    assert [p["question"] for p in other] != [p["question"] for p in train]
    problem = test[0]
    assert task.reward(problem["answer"] + "</answer>", problem).reward == 1.0
    wrong = task.reward("zzzz</answer>", problem)
    assert wrong.reward < 1.0 and wrong.metrics["correct"] == 0.0
    assert task.reference_completion(problem) == problem["answer"] + "</answer>"
    with pytest.raises(ConfigError, match="splits"):
        task.problems("validation")


def test_prompt_has_instruction_examples_and_prefill():
    from rlkit.backends.local.models import load_tokenizer

    task = build_task({"name": "reasoning_gym", "dataset": "gcd", "num_train": 4, "num_test": 1, "num_shots": 1})
    tok = load_tokenizer("tiny")
    shot = task._shots[0]
    text = tok.decode(task.prompt(task.problems("train")[0], tok))
    assert "<answer></answer>" in text and f"<answer>{shot['answer']}</answer>" in text
    assert text.rstrip().endswith("<answer>")
    plain = build_task({"name": "reasoning_gym", "dataset": "gcd", "num_train": 4, "num_test": 1, "prefill": False})
    assert plain.reward("I think <answer>" + plain.problems("test")[0]["answer"] + "</answer>", plain.problems("test")[0]).reward == 1.0


def test_dataset_options_flat_or_nested_are_checked():
    task = build_task({"name": "reasoning_gym", "dataset": "leg_counting", "num_train": 4, "num_test": 1, "max_animals": 3,
                       "options": {"min_animals": 2}})
    assert (task.dataset.config.min_animals, task.dataset.config.max_animals) == (2, 3)
    with pytest.raises(ConfigError, match=r"task.min_animal: not an option of reasoning-gym's leg_counting.*did you mean 'min_animals'"):
        build_task({"name": "reasoning_gym", "dataset": "leg_counting", "min_animal": 3})
    with pytest.raises(ConfigError, match="refuses"):  # the dataset's own validation, one line
        build_task({"name": "reasoning_gym", "dataset": "leg_counting", "min_animals": 5, "max_animals": 2})
    with pytest.raises(ConfigError, match="nearest: leg_counting"):
        build_task({"name": "reasoning_gym", "dataset": "leg_countin"})


def test_options_belong_to_their_dataset():
    """A key of ``options`` that names a dataset holds that dataset's options: only the chosen
    dataset's block applies, every block is checked against its own config, and flat keys are the
    chosen dataset's (over its block)."""
    blocks = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2}, "leg_counting": {"min_animals": 2, "max_animals": 4}}
    spec = {"name": "reasoning_gym", "num_train": 4, "num_test": 1, "options": blocks}
    legs = build_task({**spec, "dataset": "leg_counting", "max_animals": 3})
    assert (legs.dataset.config.min_animals, legs.dataset.config.max_animals) == (2, 3)
    gcd = build_task({**spec, "dataset": "gcd"})  # no block of its own: its defaults, the others left out
    assert gcd.dataset.config == build_task({"name": "reasoning_gym", "dataset": "gcd", "num_train": 4, "num_test": 1}).dataset.config
    with pytest.raises(ConfigError, match=r"^task.options.basic_arithmetic.min_term: not an option of reasoning-gym's basic_arithmetic"):
        build_task({**spec, "dataset": "gcd", "options": {"basic_arithmetic": {"min_term": 2}}})
    with pytest.raises(ConfigError, match=r"^task.options.leg_countin: not a reasoning-gym dataset.*nearest: leg_counting"):
        build_task({**spec, "dataset": "gcd", "options": {"leg_countin": {"max_animals": 3}}})
    with pytest.raises(ConfigError, match=r"^task.options.min_terms: not an option of reasoning-gym's gcd"):
        build_task({**spec, "dataset": "gcd", "options": {"min_terms": 2}})


def test_switching_the_recipes_dataset_alone_runs_through_rlkit_train(tmp_path):
    """``train.task.dataset=leg_counting`` on a recipe whose options are basic_arithmetic's just
    runs (the issue's command); the recipe's block still applies when its dataset is chosen."""
    from omegaconf import OmegaConf

    from rlkit.composition import compose

    run = tmp_path / "run"
    code = cli.main(["train", "recipe=reasoning_gym_grpo_smoke", "train.task.dataset=leg_counting", "train.steps=1",
                     "logger.console=false", f"run_dir={run}"])
    assert code == 0
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert "reward/reasoning_gym/correct" not in metrics[0] and "reward/correct" in metrics[0]
    assert metrics[0]["tokens/sampled"] > 0
    assert "dataset: leg_counting" in (run / "config.yaml").read_text()

    def task_of(*overrides):
        return build_task(OmegaConf.to_container(compose(["recipe=reasoning_gym_grpo_smoke", *overrides]).train.task, resolve=True))

    assert task_of().dataset.config.max_digits == 2  # the recipe's basic_arithmetic block
    legs = task_of("train.task.dataset=leg_counting", "+train.task.max_animals=3", "+train.task.options.leg_counting.min_animals=2")
    assert (legs.dataset.config.min_animals, legs.dataset.config.max_animals) == (2, 3)


def test_an_option_the_chosen_dataset_does_not_take_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "recipe=reasoning_gym_grpo_smoke", "train.task.dataset=leg_counting", "+train.task.min_terms=2",
                  f"run_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert len(err) == 1 and "task.min_terms: not an option of reasoning-gym's leg_counting" in err[0], err


def test_unknown_dataset_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "recipe=reasoning_gym_grpo_smoke", "train.task.dataset=basic_arithmatic", f"run_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert len(err) == 1 and "nearest: basic_arithmetic" in err[0], err


def test_countdown_recipe_rewards_any_expression_that_reaches_the_target():
    """The measured countdown recipe composes, and its reward is the verifier, not the reference: an
    expression other than the dataset's answer that reaches the target scores 1 (why SFT on one
    reference is a weaker signal there)."""
    from omegaconf import OmegaConf

    from rlkit.composition import compose

    cfg = compose(["recipe=reasoning_gym_countdown_grpo"])
    spec = OmegaConf.to_container(cfg.train.task, resolve=True)
    task = build_task({**spec, "num_train": 40, "num_test": 5})
    assert (task.dataset.config.min_numbers, task.dataset.config.max_numbers) == (3, 3)
    for problem in task.problems("train"):
        meta = problem["entry"]["metadata"]
        a, b, c = meta["numbers"]
        reference = problem["answer"].replace(" ", "")
        for other in (f"{a}+{b}+{c}", f"{c}+{b}+{a}", f"{a}*{b}+{c}", f"{a}*{b}-{c}", f"{a}+{b}*{c}"):
            if eval(other) == meta["target"] and other != reference:  # noqa: S307 (digits and + - *)
                assert task.reward(other + "</answer>", problem).reward == 1.0
                assert task.reward(f"{a}+{b}+{c}+1</answer>", problem).reward < 1.0
                return
    pytest.fail("no training problem of the recipe has a second solution among the expressions tried")
